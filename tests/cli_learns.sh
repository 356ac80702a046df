#!/usr/bin/env bash
# The demo learns, and its schedule is predictable:
#  - the pipeline (coordinator + 3 stage processes) trains configs/demo.yaml
#    with the demo's seed; its final image->text recall@1 over 256 held-out
#    pairs must be at least 0.5 (chance: 1/256);
#  - `mmpipe simulate`, fed the run's own measured costs, predicts the
#    measured step time within 35% (typically within 5% on an idle machine;
#    the bar is loose because this test shares the CI machine with others,
#    and the figure itself is a bench one: bench/balance.sh);
#  - each branch stage waits on its data loader for under 15% of its step
#    time (typically < 1%; loose for the same reason);
#  - the single-process trainer with another seed must reach the same bar.
# Minutes long: labelled slow (not run under the sanitizers).
# ctest-labels: slow
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
W=$TMP/cli_learns
rm -rf "$W"; mkdir -p "$W"
"$BIN" data synth --out "$W/shapes" --samples 20000 --seed 1 >/dev/null 2>&1 || { echo "synth failed"; exit 1; }
set_data=(--set data.manifest="$W/shapes/train.jsonl")

check_r1() { # name run
  local r; r=$(last_metric "$2/metrics.jsonl" val_i2t_r1)
  if [ -n "$r" ] && awk -v r="$r" 'BEGIN{exit !(r >= 0.5)}'; then ok "$1: final val_i2t_r1=$r >= 0.5"
  else fail "$1: final val_i2t_r1=${r:-none} < 0.5"; tail -5 "$2.log"; fi
}

"$BIN" launch configs/demo.yaml --out "$W/pipe" "${set_data[@]}" >"$W/pipe.log" 2>&1 || fail "pipeline run"
check_r1 "pipeline, seed 1" "$W/pipe"
n=$(grep -c 'started .* (pid ' "$W/pipe.log")
[ "$n" -ge 3 ] && ok "pipeline ran $n stage processes" || fail "pipeline ran $n stage processes"

# data wait of each branch stage (time blocked on the loader) under 15% of its step time
for st in image.0 text.0; do
  share=$(grep -o "\"name\":\"$st\"[^}]*" "$W/pipe/metrics.jsonl" | tail -n +2 |
    sed -E 's/.*"wall_ms":([0-9.e+-]+),"data_wait_ms":([0-9.e+-]+).*/\2 \1/' |
    awk '{w += $1; t += $2} END {if (t > 0) printf "%.4f", w / t}')
  if [ -n "$share" ] && awk -v s="$share" 'BEGIN{exit !(s < 0.15)}'; then ok "$st: data wait $share of its step time (< 0.15)"
  else fail "$st: data wait share ${share:-none}"; fi
done

out=$("$BIN" simulate configs/demo.yaml --costs "$W/pipe" "${set_data[@]}" 2>&1)
err=$(grep -o 'prediction error [-+0-9.]*%' <<<"$out" | grep -o '[-+0-9.]*')
if [ -n "$err" ] && awk -v e="$err" 'BEGIN{e = e < 0 ? -e : e; exit !(e <= 35)}'; then
  ok "simulate predicts the demo's step time within 35% (error $err%)"
else fail "simulate prediction error ${err:-none}%"; echo "$out" | tail -4; fi

"$BIN" launch configs/demo.yaml --single-process --out "$W/single2" --set job.seed=2 "${set_data[@]}" \
  >"$W/single2.log" 2>&1 || fail "single-process run"
check_r1 "single-process, seed 2" "$W/single2"
finish
