#!/usr/bin/env bash
# ctest-labels: slow
# Load balancing across hosts: two network-namespace hosts (tests/hosts_lib.sh:
# each its own sshd; the coordinator in a namespace of its own starts every
# stage with the ssh launcher), three cpu slots each. Checked:
#  1. configs/sim-uneven.yaml (4:1:1, simulated compute) from 2/2/2, where
#     both image replicas sit on host ha: balance.mode: dynamic re-places to
#     image.0:4 text.0:1 fusion:1 (as tests/cli_balance.sh 3 on one host),
#     which puts image.0 replica 3 on host hb: relaunched through ssh there,
#     its channels and the image replicas' reduce over tcp across hosts; the
#     run finishes with its checkpoint; nothing left on any host;
#  2. balancing changes speed, never the math, across hosts (as
#     tests/cli_balance.sh 1): real compute, image split in two, scripted
#     re-placement at step 10 from replicas [2, 1] to [1, 2], which moves
#     image.1's second replica onto the other host: 20 steps equal
#     --single-process bitwise (max_abs_diff=0); nothing left.
# Speed is bench/hosts_balance.sh's. Skips (77) only when network namespaces
# cannot be made here.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
. tests/hosts_lib.sh
workdir
BIN=$(realpath "$BIN")
trap hosts_down EXIT
hosts_up ha hb; rc=$?
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] && ok "two namespace hosts, ssh reaches both" || { fail "hosts: rc $rc"; finish; exit 1; }
synth 800 4
hosts_plan() { # SRC SLOTS_A SLOTS_B: SRC without its hosts: line, on ha and hb over ssh
  sed '/^hosts:/d' "$1"
  cat <<YAML
launcher: ssh
launcher_command: ssh -F $SSHCFG {address}
control: { address: 10.77.0.1 }
hosts:
  - { name: ha, address: 10.77.0.2, devices: [$2], workdir: $PWD, binary: $BIN }
  - { name: hb, address: 10.77.0.3, devices: [$3] }
YAML
}

# --- 1. sim-uneven, dynamic, re-placing across hosts ---------------------------------
hosts_plan configs/sim-uneven.yaml "cpu, cpu, cpu" "cpu, cpu, cpu" >"$W/uneven.yaml"
ipc "$BIN" launch "$W/uneven.yaml" --set "data.manifest=$W/data/train.jsonl" --set job.steps=30 \
  --out "$W/dyn" >"$W/dyn.log" 2>&1 && [ -e "$W/dyn/ckpt/latest" ] \
  && ok "2 hosts, sim-uneven, dynamic: 30 steps and the final checkpoint" \
  || { fail "2-host dynamic run"; tail -8 "$W/dyn.log"; }
# before: image replicas 0 and 1 on ha (slots 0, 1), text.0/0 on ha, the rest on hb
grep -q '"placement":"image.0:2 text.0:2 fusion:2"' "$W/dyn/metrics.jsonl" \
  && [ "$(grep -c 'started image.0/[0-9] (pid [0-9]*, ssh to host ha' "$W/dyn.log")" -ge 2 ] \
  && ! grep -q 'started image.0/[01] (pid [0-9]*, ssh to host hb' "$W/dyn.log" \
  && ok "starts 2/2/2 with both image replicas on host ha" || fail "initial placement"
at=$(grep -n '"action":"replace","to":"image.0:4 text.0:1 fusion:1"' "$W/dyn/metrics.jsonl" | head -1 | cut -d: -f1)
[ -n "$at" ] && [ "$at" -le 30 ] && ok "dynamic: re-placed to image.0:4 text.0:1 fusion:1 after step $at" \
  || fail "dynamic: no re-placement to image.0:4 text.0:1 fusion:1 ($(grep -o '"to":"[^"]*"' "$W/dyn/metrics.jsonl" | head -1))"
# after: the relaunch (the second 'stage processes' line) starts image.0/3 on hb
after=$(awk '/stage processes \(image.0:4 text.0:1 fusion:1\)/ { n = NR } END { print n + 0 }' "$W/dyn.log")
[ "$after" -gt 0 ] && grep -q 'started image.0/3 (pid [0-9]*, ssh to host hb at 10.77.0.3)' "$W/dyn.log" \
  && grep -q 'started image.0/2 (pid [0-9]*, ssh to host ha at 10.77.0.2)' "$W/dyn.log" \
  && ok "the re-placement moved an image replica across hosts: image.0/3 relaunched through ssh on hb" \
  || fail "no image replica relaunched on host hb"
tcp_after=$(grep 'data channels:' "$W/dyn.log" | tail -1 | grep -o '[0-9]* over tcp' | grep -o '^[0-9]*')
grep -q 'image.0/3: replicas. reduce over tcp via 10.77.0.2:[0-9]* (rank 3 of 4)' "$W/dyn.log" \
  && [ "${tcp_after:-0}" -gt 0 ] \
  && ok "after it: $tcp_after data channels over tcp, image.0's four replicas reduce over tcp across hosts" \
  || fail "after the re-placement: channels/reduce not over tcp ($(grep 'data channels:' "$W/dyn.log" | tail -1))"
steps_once "$W/dyn/metrics.jsonl" 30 && ok "metrics: steps 1..30 once each across the relaunch" \
  || fail "metrics steps across the relaunch"
nothing_left "sim-uneven dynamic" "$W/dyn.log"

# --- 2. the math: a scripted re-placement across hosts equals one process ----------------
balance_plan "$W/real-src.yaml" 20 0 'step: 10, set: "stages.image.replicas=[1,2]"'
hosts_plan "$W/real-src.yaml" "cpu, cpu" "cpu, cpu, cpu" >"$W/real.yaml"
"$BIN" launch "$W/real-src.yaml" --single-process --out "$W/single" >"$W/single.log" 2>&1 \
  || { fail "single-process run"; tail -5 "$W/single.log"; }
ipc "$BIN" launch "$W/real.yaml" --out "$W/real" >"$W/real.log" 2>&1 \
  && ok "real compute, scripted re-placement at step 10 across hosts: the run completes" \
  || { fail "2-host real run"; tail -8 "$W/real.log"; }
grep -q 'started image.1/1 (pid [0-9]*, ssh to host hb' "$W/real.log" \
  && grep -q '"placement":"image.0\[0:2):1 image.1\[2:5):2 text.0:1 fusion:1"' "$W/real/metrics.jsonl" \
  && ok "after step 10: image.1's second replica on host hb" || fail "image.1/1 not re-placed on hb"
out=$(same_ckpt "$W/single" "$W/real") && ok "2 hosts + re-placement vs single-process: $out" \
  || fail "2 hosts + re-placement differ from single-process: $out"
nothing_left "real, re-placed across hosts" "$W/real.log"
finish
