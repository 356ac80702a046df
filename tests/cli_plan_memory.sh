#!/usr/bin/env bash
# `mmpipe simulate --plan-devices N --device-memory SIZE` (issue 13): the
# planner keeps every device under the cap, using the memory a run measured
# per stage (peak_mem_bytes, split into state_bytes and the rest per
# act_slots: coordinator/costs.h). From one short run: a generous cap (10x
# the largest stage) changes nothing; a cap under the largest stage of that
# unconstrained placement (as charged: a replica holds fewer micro-batches,
# so it is not the measured peak) either cuts or re-places so that every
# stage printed fits it, or says no placement fits; a cap under every stage
# is refused naming the cap; --device-memory without --costs is a usage
# error.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 256 3
tiny_plan "name: pm, steps: 3, seed: 5" "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24" \
  1 "batch: 16, microbatches: 4, eval_every: 0, final_eval: false"
"$BIN" launch "$W/plan.yaml" --out "$W/run" >"$W/run.log" 2>&1 || { fail "run failed"; tail -5 "$W/run.log"; finish; exit 1; }
peaks=$(tail -1 "$W/run/metrics.jsonl" | grep -o '"peak_mem_bytes":[0-9.e+]*' | sed 's/.*://')
max=$(tr ' ' '\n' <<<"$peaks" | sort -g | tail -1); min=$(tr ' ' '\n' <<<"$peaks" | sort -g | head -1)
keys() { grep '^as plan keys' "$1"; }
"$BIN" simulate "$W/plan.yaml" --costs "$W/run" --plan-devices 6 >"$W/free.txt" 2>&1
"$BIN" simulate "$W/plan.yaml" --costs "$W/run" --plan-devices 6 --device-memory $(awk -v m="$max" 'BEGIN { printf "%.0f", 10 * m }') >"$W/big.txt" 2>&1 \
  && [ -n "$(keys "$W/free.txt")" ] && [ "$(keys "$W/free.txt")" = "$(keys "$W/big.txt")" ] \
  && ok "a cap of 10x the largest stage changes nothing" || fail "generous cap: $(keys "$W/big.txt") vs $(keys "$W/free.txt")"
# the stages' memory as printed (MiB under 1 GiB, GiB above), in bytes, one a line
stage_bytes() { grep -v '^(' "$1" | sed 's/(cap.*//' | grep -oE '[0-9.]+ (MiB|GiB)' \
  | awk '{ print $1 * ($2 == "GiB" ? 1073741824 : 1048576) }'; }
# A cap under the unconstrained placement's largest stage (as the planner
# charges it: its parameters, and activations for what its schedule holds)
# cannot keep that placement.
freemax=$(stage_bytes "$W/big.txt" | sort -g | tail -1)
cap=$(awk -v m="${freemax:-0}" 'BEGIN { printf "%.0f", 0.9 * m }')
if "$BIN" simulate "$W/plan.yaml" --costs "$W/run" --plan-devices 6 --device-memory "$cap" >"$W/tight.txt" 2>&1; then
  over=$(stage_bytes "$W/tight.txt" | awk -v c="$cap" '{ if ($1 > c * 1.001) n++ } END { print n + 0 }')
  [ "$over" -eq 0 ] && [ "$(keys "$W/tight.txt")" != "$(keys "$W/free.txt")" ] \
    && ok "a cap under the free placement's largest stage ($cap bytes): another placement, every stage under it" \
    || fail "tight cap: $over stages over it; $(keys "$W/tight.txt")"
else
  grep -q 'no placement fits the memory cap' "$W/tight.txt" && ok "a cap under the largest stage: no placement fits, said so" \
    || fail "tight cap: $(tail -1 "$W/tight.txt")"
fi
expect_fail "a cap under every stage is refused" "no placement fits the memory cap" \
  "$BIN" simulate "$W/plan.yaml" --costs "$W/run" --plan-devices 6 --device-memory $(awk -v m="$min" 'BEGIN { printf "%.0f", 0.1 * m }')
expect_fail "--device-memory without --costs" "needs --plan-devices and --costs" \
  "$BIN" simulate "$W/plan.yaml" --plan-devices 6 --device-memory 4G
expect_fail "--device-memory 4X" "expected a byte count" \
  "$BIN" simulate "$W/plan.yaml" --costs "$W/run" --plan-devices 6 --device-memory 4X
finish
