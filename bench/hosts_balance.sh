#!/usr/bin/env bash
# Dynamic balancing across hosts, measured; judges nothing (the decisions
# are asserted in tests/cli_hosts_balance.sh). Two network-namespace hosts
# (tests/hosts_lib.sh: each its own sshd, the ssh launcher, the control plane
# over tcp with CURVE), three cpu slots each, configs/sim-uneven.yaml
# (4:1:1, simulated compute): static 2/2/2 (balance.mode: off) against
# dynamic, which re-places to image.0:4 text.0:1 fusion:1 and so moves an
# image replica onto the other host (channels and reduce over tcp across
# the hosts). Each rep runs both; steady samples/s are the medians of
# steps 2-8 (static) and 21-30 (dynamic); the ratio is taken within a rep,
# the table gives the medians over reps. Needs root (network namespaces).
#   bench/hosts_balance.sh [--bin build/mmpipe] [--out runs/bench-hosts-balance] [--reps 3]
set -uo pipefail
. "$(dirname "$0")/lib.sh" || exit 1
bench_args bench/hosts_balance.sh --bin=BIN=build/mmpipe --out=OUT=runs/bench-hosts-balance \
  --reps=REPS=3 -- "$@"
bench_need_bin
case $REPS in '' | *[!0-9]* | 0) echo "bench/hosts_balance.sh: --reps wants a count >= 1" >&2; exit 2 ;; esac
. tests/lib.sh # median, metric
. tests/hosts_lib.sh
BIN=$(realpath "$BIN")
rm -rf "$OUT"; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
W=$OUT
trap hosts_down EXIT
hosts_up ha hb >&2 || { say "cannot make the namespace hosts"; exit 1; }
"$BIN" data synth --out "$OUT/data" --samples 2000 --seed 4 >/dev/null 2>&1 || { say "synth failed"; exit 1; }
sed '/^hosts:/d' configs/sim-uneven.yaml >"$OUT/plan.yaml"
cat >>"$OUT/plan.yaml" <<YAML
launcher: ssh
launcher_command: ssh -F $SSHCFG {address}
control: { address: 10.77.0.1 }
hosts:
  - { name: ha, address: 10.77.0.2, devices: [cpu, cpu, cpu], workdir: $PWD, binary: $BIN }
  - { name: hb, address: 10.77.0.3, devices: [cpu, cpu, cpu] }
YAML
run() { # NAME ARGS...
  local name=$1; shift
  say "$name ..."
  ipc "$BIN" launch "$OUT/plan.yaml" --set "data.manifest=$OUT/data/train.jsonl" "$@" \
    --out "$OUT/$name" >"$OUT/$name.log" 2>&1 || { say "$name failed (see $OUT/$name.log)"; exit 1; }
}
: >"$OUT/reps.txt"
for r in $(seq "$REPS"); do
  run "static-$r" --set job.steps=8 --set balance.mode=off
  run "dynamic-$r" --set job.steps=30
  grep -q 'started image.0/3 (pid [0-9]*, ssh to host hb' "$OUT/dynamic-$r.log" \
    || { say "dynamic-$r: no image replica re-placed onto host hb (see its log)"; exit 1; }
  s=$(metric "$OUT/static-$r/metrics.jsonl" samples_per_s 2 8 | median)
  d=$(metric "$OUT/dynamic-$r/metrics.jsonl" samples_per_s 21 30 | median)
  e=$(metric "$OUT/dynamic-$r/metrics.jsonl" efficiency 21 30 | median)
  at=$(grep -n '"action":"replace"' "$OUT/dynamic-$r/metrics.jsonl" | head -1 | cut -d: -f1)
  echo "$s $d $(awk -v a="$d" -v b="$s" 'BEGIN { printf "%.3f", a / b }') $e ${at:-none}" >>"$OUT/reps.txt"
  say "rep $r: static $s, dynamic $d samples/s (re-placed after step ${at:-none})"
done
col() { awk -v c="$1" '{ print $c }' "$OUT/reps.txt" | median; }
echo "| 2 hosts (namespaces, ssh), sim-uneven, $REPS reps, medians | samples/s |"
echo "|---|---|"
echo "| static 2/2/2 (steps 2-8) | $(col 1) |"
echo "| dynamic, re-placed to image.0:4 text.0:1 fusion:1 across hosts (steps 21-30) | $(col 2) |"
echo "| ratio dynamic / static (per rep, then median) | $(col 3)x |"
echo "| balance efficiency, dynamic (steps 21-30) | $(col 4) |"
echo "| re-placed after step (per rep) | $(awk '{ print $5 }' "$OUT/reps.txt" | paste -sd, -) |"
