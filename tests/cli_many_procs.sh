#!/usr/bin/env bash
# ctest-labels: slow
# One plan with more processes than the 64 a plan held before, really
# launched on this host: 68 stage processes (image cut in two sub-stages of
# 17 replicas each, text 17, fusion 17; 17 micro-batches of one sample). The
# run starts under a soft RLIMIT_NOFILE of 68, fewer than the coordinator
# needs for 68 control connections: it raises the soft limit to the hard
# one. Checked: the run completes, every step's metrics.jsonl line lists all
# 68 processes, the checkpoint equals --single-process bitwise
# (max_abs_diff=0), and no stage process or /dev/shm segment is left. With
# the hard limit below the need (32 + one a process), the launch fails at
# once naming the limits. Prints the stage processes' memory (RSS and PSS,
# summed over all of them at their peak). MMP_MANY_REPLICAS=33 runs 132
# processes (checked by hand: about 20 s).
#
# Memory: a stage process of a CUDA build holds about 95 MB (PSS) even on
# the CPU, 84 MB of it libcublasLt's zero-initialised data, which its static
# initialisers touch (measured 2026-11-25): 68 processes are about 6.5 GB,
# which CI's Release pass runs beside another test on a 24 GB machine (132
# would be 12.5 GB).
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 200 3
R=${MMP_MANY_REPLICAS:-17}
P=$((4 * R))
cat >"$W/plan.yaml" <<YAML
job:   { name: many, steps: 2, seed: 7 }
data:  { manifest: $W/data/train.jsonl, image_size: 16, max_text_len: 12, val_samples: 8 }
model: { width: 16, image: { blocks: [1, 1], channels: [4, 8] },
         text: { layers: 2, heads: 2 }, fusion: { layers: 1, heads: 2 } }
train: { batch: $R, microbatches: $R, eval_every: 0, final_eval: false }
hosts: [ { name: localhost, devices: [cpu, cpu] } ]
stages:
  image:  { split: [1], replicas: [$R, $R] }
  text:   { replicas: $R }
  fusion: { replicas: $R }
YAML

# --- the run, its memory sampled while it goes --------------------------------------
(ulimit -Sn $P && exec "$BIN" launch "$W/plan.yaml" --out "$W/many") >"$W/many.log" 2>&1 &
cpid=$!
peak_rss=0 peak_pss=0 peak_n=0
while kill -0 $cpid 2>/dev/null; do
  pids=$(grep -o 'started [^ ]* (pid [0-9]*)' "$W/many.log" | grep -o '[0-9]*)$' | tr -d ')')
  if [ -n "$pids" ]; then
    # one awk a sample over every stage's status and smaps_rollup (kB)
    read -r n rss pss < <(for pid in $pids; do echo /proc/$pid/status /proc/$pid/smaps_rollup; done \
      | xargs awk '/^VmRSS:/ { n++; r += $2 } /^Pss:/ { p += $2 } END { print n + 0, r + 0, p + 0 }' 2>/dev/null)
    [ "${rss:-0}" -gt $peak_rss ] && peak_rss=$rss peak_pss=$pss peak_n=$n
  fi
  sleep 0.2
done
wait $cpid
rc=$?
[ $rc -eq 0 ] && ok "$P stage processes: the run completes" \
  || { fail "$P processes: launch rc=$rc"; tail -5 "$W/many.log" | sed 's/^/    /'; }
echo "  memory at the peak: $peak_n stage processes, RSS $((peak_rss / 1024)) MB ($((peak_rss / 1024 / (peak_n > 0 ? peak_n : 1))) MB each, shared libraries counted in each), PSS $((peak_pss / 1024)) MB ($((peak_pss / 1024 / (peak_n > 0 ? peak_n : 1))) MB each)"
n=$(grep -c 'started [^ ]* (pid' "$W/many.log")
[ "$n" -eq $P ] && ok "$n processes started" || fail "$n processes started, want $P"
lines=$(wc -l <"$W/many/metrics.jsonl" 2>/dev/null || echo 0)
entries=$(tail -1 "$W/many/metrics.jsonl" 2>/dev/null | grep -o '"replica":' | wc -l)
[ "$lines" -eq 2 ] && [ "$entries" -eq $P ] && ok "metrics.jsonl: 2 steps, $entries process entries each" \
  || fail "metrics.jsonl: $lines lines, $entries process entries in the last (want 2, $P)"
left_behind "$P processes" "$W/many.log"

# --- the same math as one process -----------------------------------------------------
"$BIN" launch "$W/plan.yaml" --single-process --out "$W/single" >"$W/single.log" 2>&1 \
  || { fail "single-process run"; tail -3 "$W/single.log"; }
out=$(same_ckpt "$W/single" "$W/many") && ok "$P processes vs single-process: $out" \
  || fail "$P processes differ from single-process: $out"

# --- more descriptors than the hard limit allows: a clear error, nothing started -------
need=$((64 + 2 * P)) lim=$((32 + P))
expect_fail "hard RLIMIT_NOFILE $lim < $need" \
  "$P stage processes need about $need open files, more than this process may have \(RLIMIT_NOFILE: soft $lim, hard $lim" \
  bash -c "ulimit -n $lim && exec \"$BIN\" launch \"$W/plan.yaml\" --out \"$W/nofile\""
finish
