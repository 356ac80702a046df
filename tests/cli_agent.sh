#!/usr/bin/env bash
# ctest-labels: slow
# launcher: agent (transport/rexec.h), for nodes with no sshd and no SLURM:
# network namespaces joined by a bridge act as hosts, each running `mmpipe
# agent` with a key made here (no sshd anywhere); the coordinator runs in a
# namespace of its own and starts every stage through `mmpipe rexec` to the
# agent on the stage's host, the control plane over tcp with CURVE. Checked:
#  1. image replica 0, image replica 1, text and fusion on four hosts: the
#     final checkpoint equals --single-process (max_abs_diff=0), every data
#     channel over tcp, no secret in any process's argv;
#  2. strangers: a connection that does not hold the key (random bytes;
#     rexec with another key) is refused by the agent and logged with its
#     address, and runs nothing; 40 idle connections do not keep a relay
#     out (the agent's gate: transport/auth.h); a key file others may read is refused by
#     launch before anything starts, and by the agent;
#  3. SIGKILL of a remote stage: noticed, named with its host, job stopped;
#     with train.max_restarts the job restarts through the agents and
#     equals --single-process;
#  4. a host's link taken down mid-run: named within 15 s, job stopped, and
#     the cut-off stage ends (its agent closes its input, then SIGTERM);
#  5. an agent stopped (SIGTERM) mid-run: its stage ends, the job stops
#     naming it;
#  6. SIGINT to the coordinator: checkpoint, exit 130;
#  7. the coordinator SIGKILLed: every remote stage exits (its input ends);
# and after each run: no stage process and no /dev/shm entry left anywhere.
# Skips (77) only when network namespaces cannot be made here.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
. tests/hosts_lib.sh # hosts_up, hosts_down, ipc, remote_left, nothing_left, case_*
workdir
BIN=$(realpath "$BIN")
AGENTS=()
agents_down() {
  local p
  for p in "${AGENTS[@]}"; do kill "$p" 2>/dev/null; done
  for p in "${AGENTS[@]}"; do wait "$p" 2>/dev/null; done
  hosts_down
}
trap agents_down EXIT
HOSTS_SSHD=0 hosts_up ia ib tx fu; rc=$? # image replica 0, image replica 1, text, fusion
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || { fail "hosts: rc $rc"; finish; exit 1; }
KEY=$W/agent.key
"$BIN" agent --new-key "$KEY" >/dev/null && [ "$(stat -c %a "$KEY")" = 600 ] \
  && ok "agent --new-key: a key of mode 600" || fail "agent --new-key"
# agent_up HOST N: the agent of namespace HOST at 10.77.0.N, its pid in AGENT_PID
agent_up() {
  ip netns exec "${P}$1" "$BIN" agent --key-file "$KEY" --listen "10.77.0.$2:29470" \
    >"$W/agent-$1.log" 2>&1 &
  AGENT_PID=$!
  AGENTS+=("$AGENT_PID")
  local i
  for i in $(seq 100); do grep -q 'listening on' "$W/agent-$1.log" && return 0; sleep 0.05; done
  return 1
}
# tx's agent relays a stage's end 800 ms late, as a busy host may: its
# stage's connection is gone that long before the coordinator hears it died,
# and the kill cases below must still name that death (not the error a peer
# reported, nor "no peer connected" on the next send) and restart from it.
n=2
for h in ia ib tx fu; do
  if [ $h = tx ]; then
    MMP_TEST_AGENT_STATUS_DELAY_MS=800 agent_up "$h" $n || fail "agent on $h"
  else
    agent_up "$h" $n || fail "agent on $h"
  fi
  n=$((n + 1))
done
FU_AGENT=$AGENT_PID
ok "four agents listening"

synth 300 4
tiny_plan "name: agents, steps: 30, seed: 5" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 32" \
  2 "batch: 16, microbatches: 4, eval_every: 0, ckpt_every: 0" \
  "launcher: agent" \
  "agent: { key_file: $KEY }" \
  "control: { address: 10.77.0.1 }" \
  "hosts:" \
  "  - { name: ia, address: 10.77.0.2, devices: [cpu], workdir: $PWD, binary: $BIN }" \
  "  - { name: ib, address: 10.77.0.3, devices: [cpu] }" \
  "  - { name: tx, address: 10.77.0.4, devices: [cpu] }" \
  "  - { name: fu, address: 10.77.0.5, devices: [cpu] }" \
  "stages: { image: { replicas: 2 } }"

# 1. the run across four hosts equals one process
ip netns exec "${P}c" "$BIN" launch "$W/plan.yaml" --out "$W/multi" >"$W/multi.log" 2>&1 &
cpid=$!
wait_step "$W/multi/metrics.jsonl" 3 60 || fail "multi: no step 3"
secret_in_argv=$(ps -eo args | grep -v grep | grep -c 'secrets-1\|MMP_JOB_TOKEN')
key_in_argv=$(ps -eo args | grep -v grep | grep -c -- "$(cat "$KEY")")
wait $cpid && ok "multi-host run through agents" || { fail "multi-host run"; tail -20 "$W/multi.log"; }
grep -q 'data channels: 0 over cuda_ipc, 0 over shm, [1-9][0-9]* over tcp' "$W/multi.log" \
  && ok "every data channel over tcp between hosts" || fail "data channels: $(grep 'data channels' "$W/multi.log")"
grep -q 'fusion/0 (pid [0-9]*, agent to host fu at 10.77.0.5)' "$W/multi.log" \
  && grep -q 'image.0/1 (pid [0-9]*, agent to host ib at 10.77.0.3)' "$W/multi.log" \
  && grep -q "agent: 10.77.0.1:[0-9]*: pid [0-9]*: cd '$PWD' && exec" "$W/agent-fu.log" \
  && ok "stages started by the agents on their hosts" || fail "placement over hosts: $(grep -m2 started "$W/multi.log")"
"$BIN" launch "$W/plan.yaml" --out "$W/single" --single-process >"$W/single.log" 2>&1 || fail "single"
same_ckpt "$W/multi/ckpt/latest" "$W/single/ckpt/latest" && ok "four hosts through agents == single process" \
  || fail "four hosts != single process"
[ "$secret_in_argv" -eq 0 ] && [ "$key_in_argv" -eq 0 ] && ok "no secret and no agent key in any argv" \
  || fail "a secret ($secret_in_argv) or the agent key ($key_in_argv) in a process list"
nothing_left multi "$W/multi.log"

# 2. strangers at the agent's door
ip netns exec "${P}ib" bash -c 'exec 3<>/dev/tcp/10.77.0.5/29470 || exit 1
  head -c 200 /dev/urandom >&3; timeout 2 cat <&3 >/dev/null; exec 3>&-'
"$BIN" agent --new-key "$W/other.key" >/dev/null
ip netns exec "${P}ib" "$BIN" rexec --key-file "$W/other.key" 10.77.0.5:29470 "touch $W/pwned" \
  >"$W/other.out" 2>&1; rc=$?
sleep 0.3
[ $rc -eq 255 ] && [ ! -e "$W/pwned" ] && grep -q 'does not hold' "$W/other.out" \
  && [ "$(grep -c 'connector 10.77.0.3:[0-9]*: .*refused' "$W/agent-fu.log")" -ge 2 ] \
  && ok "strangers refused and logged by the agent (random bytes, another key), nothing run" \
  || { fail "strangers: rc $rc, $(cat "$W/other.out")"; grep refused "$W/agent-fu.log"; }
ip netns exec "${P}ib" "$BIN" rexec --key-file "$KEY" 10.77.0.5:29470 "echo out; echo err >&2; exit 3" \
  >"$W/good.out" 2>"$W/good.err"; rc=$?
[ $rc -eq 3 ] && [ "$(cat "$W/good.out")" = out ] && [ "$(cat "$W/good.err")" = err ] \
  && ok "rexec with the key: output, error and exit status relayed" || fail "rexec: rc $rc"
# 40 strangers that connect and say nothing (more than the gate's 32
# places) do not keep a relay out: they wait in the agent's gate, each
# dropped after 5 s, and never get a process of their own
ip netns exec "${P}ib" bash -c 'for i in $(seq 40); do exec {fd}<>/dev/tcp/10.77.0.5/29470 || exit 1; done
  sleep 6' &
idle=$!
sleep 1
served_before=$(pgrep -P "$FU_AGENT" | wc -l)
t0=$(date +%s.%N)
ip netns exec "${P}ib" "$BIN" rexec --key-file "$KEY" 10.77.0.5:29470 "exit 0"; rc=$?
dt=$(echo "$(date +%s.%N) - $t0" | bc)
wait $idle
[ $rc -eq 0 ] && [ "$(echo "$dt < 2" | bc)" -eq 1 ] && [ "$served_before" -eq 0 ] \
  && ok "40 idle strangers: a relay still runs in ${dt}s, no process for any of them" \
  || fail "idle strangers: rc $rc after ${dt}s, $served_before serving processes"
cp "$KEY" "$W/open.key"; chmod 644 "$W/open.key"
expect_fail "a key file others may read is refused by launch" "agent key .*open.key: mode 644" \
  ip netns exec "${P}c" "$BIN" launch "$W/plan.yaml" --out "$W/open" --set "agent.key_file=$W/open.key"
expect_fail "... and by the agent" "mode 644 lets its group or others read it" \
  "$BIN" agent --key-file "$W/open.key" --listen 127.0.0.1:0
grep -v '^agent:' "$W/plan.yaml" >"$W/nokey.yaml"
expect_fail "launcher: agent without agent.key_file" "nokey.yaml:[0-9]+:[0-9]+: launcher: agent needs agent.key_file" \
  "$BIN" launch "$W/nokey.yaml" --out "$W/nokey"

# 3. SIGKILL of a remote stage (text, on host tx)
case_stage_killed "agent to host tx at 10.77.0.4" ip netns exec "${P}c" "$BIN" launch "$W/plan.yaml"

# 3b. the same with train.max_restarts: the coordinator relaunches every
# stage through the agents from the latest checkpoint, and the run equals
# the single process
case_restarted "through the agents" ip netns exec "${P}c" "$BIN" launch "$W/plan.yaml"

# 4. a host's link goes down mid-run (fusion's host): the coordinator's
# watch of the stage's control connection names it (the relay's keepalive
# would take 20 s)
case_link_down agent 15

# 5. the agent of fu stopped mid-run: its stage ends, the job stops naming it
# (the agent may still be serving the link-down case's connection, whose
# stage has ended but whose status waits up to 5 s for the gone relay's ack:
# it ends one command or more)
ip netns exec "${P}c" "$BIN" launch "$W/plan.yaml" --out "$W/agentstop" --set job.steps=400 \
  >"$W/agentstop.log" 2>&1 &
cpid=$!
wait_step "$W/agentstop/metrics.jsonl" 2 60 || fail "agentstop: no step 2"
kill -TERM "$FU_AGENT"; wait "$FU_AGENT" 2>/dev/null
wait $cpid; rc=$?
[ $rc -ne 0 ] && grep -q 'fusion/0 (pid [0-9]*, agent to host fu at 10.77.0.5)' "$W/agentstop.log" \
  && grep -q 'stopping: ending [1-9][0-9]* command' "$W/agent-fu.log" \
  && ok "agent stopped: its stage ended, the job stopped naming it (rc $rc)" \
  || { fail "agentstop: rc $rc"; tail -5 "$W/agentstop.log"; tail -3 "$W/agent-fu.log"; }
nothing_left agentstop "$W/agentstop.log"
agent_up fu 5 || fail "agent on fu again"

# 6. Ctrl-C (SIGINT to the coordinator): checkpoint, exit 130, every host stopped
case_sigint

# 7. the coordinator SIGKILLed: each relay passes the end of its input on, every stage exits
case_coordinator_killed
agents_down; trap - EXIT
for h in ia ib tx fu; do grep -q 'stopped$' "$W/agent-$h.log" || fail "agent $h did not stop cleanly"; done
ok "agents stopped"
finish
