#!/usr/bin/env bash
# The demo plan learns: trains configs/demo.yaml with the demo's seed and with
# another seed (both at once, one core each) on the demo data set and checks
# that each run's final image->text recall@1 over 256 held-out pairs is at
# least 0.5 (chance: 1/256). Minutes long: labelled slow (not run under the
# sanitizers, which would make it ten times longer).
# ctest-labels: slow
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
W=$TMP/cli_learns
rm -rf "$W"; mkdir -p "$W"
"$BIN" data synth --out "$W/shapes" --samples 20000 --seed 1 >/dev/null 2>&1 || { echo "synth failed"; exit 1; }
for seed in 1 2; do
  "$BIN" launch configs/demo.yaml --out "$W/seed$seed" --set job.seed=$seed \
    --set data.manifest="$W/shapes/train.jsonl" >"$W/seed$seed.log" 2>&1 &
done
wait
for seed in 1 2; do
  r=$(last_metric "$W/seed$seed/metrics.jsonl" val_i2t_r1)
  if [ -n "$r" ] && awk -v r="$r" 'BEGIN{exit !(r >= 0.5)}'; then ok "seed $seed: final val_i2t_r1=$r >= 0.5"
  else fail "seed $seed: final val_i2t_r1=${r:-none} < 0.5"; tail -5 "$W/seed$seed.log"; fi
done
finish
