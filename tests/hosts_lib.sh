# Namespace "hosts" for the multi-host tests and benches (sourced, not a test;
# tests/cli_hosts.sh, tests/cli_hosts_balance.sh, bench/hosts_balance.sh):
# hosts_up NAME... makes a coordinator namespace ${P}c holding a bridge at
# 10.77.0.1 and one namespace per NAME (10.77.0.2, .3, ... in order), each
# running its own sshd with keys made here (config in $W/ssh, nothing in
# /root/.ssh or /etc touched); hosts_down undoes it (trap it on EXIT).
# HOSTS_SSHD=0: no sshd (tests/cli_slurm.sh starts slurmd there instead).
# Returns 77 when network namespaces cannot be made here, 1 on another failure.
# case_stage_killed, case_link_down, case_sigint, case_coordinator_killed:
# the failure cases tests/cli_hosts.sh (ssh) and tests/cli_agent.sh (agent)
# both run (below); case_restarted runs in cli_agent.sh, and it and
# case_stage_killed in tests/cli_slurm.sh (through salloc).
# Sets P (the unique name prefix), HOSTS, SSHCFG ($W/ssh/config); ipc CMD runs
# CMD in the coordinator's namespace. Needs W (tests/lib.sh workdir).
hosts_down() {
  local f ns
  for f in "$W"/ssh/sshd-*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
  for ns in "${HOSTS[@]}" c; do ip netns del "${P}$ns" 2>/dev/null; done
  return 0
}
ipc() { ip netns exec "${P}c" "$@"; }
hosts_up() {
  HOSTS=("$@")
  [ "$(id -u)" -eq 0 ] || { echo "skip: needs root for network namespaces"; return 77; }
  P=m$(printf %05d $((($$ * 131 + RANDOM) % 100000))) # link names stay within 15 characters
  if ! ip netns add "${P}c" 2>"$W/netns.err"; then
    echo "skip: cannot create network namespaces: $(cat "$W/netns.err")"; return 77
  fi
  local sshd h n
  sshd=$(command -v sshd || echo /usr/sbin/sshd)
  [ -x "$sshd" ] || { echo "sshd not installed (scripts/setup installs openssh-server)"; return 1; }
  ipc ip link set lo up
  ipc ip link add br0 type bridge
  ipc ip addr add 10.77.0.1/24 dev br0
  ipc ip link set br0 up
  n=2
  for h in "${HOSTS[@]}"; do
    ip netns add "${P}$h" || return 1
    ip link add "${P}$h" type veth peer name "${P}${h}p"
    ip link set "${P}$h" netns "${P}c"
    ip link set "${P}${h}p" netns "${P}$h"
    ipc ip link set "${P}$h" master br0 up
    ip netns exec "${P}$h" ip link set lo up
    ip netns exec "${P}$h" ip link set "${P}${h}p" name eth0
    ip netns exec "${P}$h" ip addr add "10.77.0.$n/24" dev eth0
    ip netns exec "${P}$h" ip link set eth0 up
    n=$((n + 1))
  done
  [ "${HOSTS_SSHD:-1}" = 0 ] && return 0
  mkdir -p "$W/ssh" && chmod 700 "$W/ssh"
  ssh-keygen -q -t ed25519 -N '' -f "$W/ssh/host" && ssh-keygen -q -t ed25519 -N '' -f "$W/ssh/id" || return 1
  cp "$W/ssh/id.pub" "$W/ssh/authorized_keys"
  : >"$W/ssh/known_hosts"
  mkdir -p /run/sshd
  n=2
  for h in "${HOSTS[@]}"; do
    cat >"$W/ssh/sshd-$h.conf" <<CONF
ListenAddress 10.77.0.$n
HostKey $W/ssh/host
AuthorizedKeysFile $W/ssh/authorized_keys
PidFile $W/ssh/sshd-$h.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
ClientAliveInterval 1
ClientAliveCountMax 3
LogLevel ERROR
AcceptEnv OPENBLAS_CORETYPE
CONF
    ip netns exec "${P}$h" "$sshd" -f "$W/ssh/sshd-$h.conf" -E "$W/ssh/sshd-$h.log" || return 1
    echo "10.77.0.$n $(cut -d' ' -f1-2 "$W/ssh/host.pub")" >>"$W/ssh/known_hosts"
    n=$((n + 1))
  done
  SSHCFG=$W/ssh/config
  cat >"$SSHCFG" <<CONF
User root
IdentityFile $W/ssh/id
IdentitiesOnly yes
UserKnownHostsFile $W/ssh/known_hosts
StrictHostKeyChecking yes
BatchMode yes
ConnectTimeout 5
ServerAliveInterval 1
ServerAliveCountMax 3
LogLevel ERROR
CONF
  local i last=$((n - 1))
  for i in $(seq 50); do
    ipc ssh -F "$SSHCFG" "10.77.0.$last" true 2>/dev/null && return 0
    sleep 0.1
  done
  echo "ssh does not reach 10.77.0.$last"; return 1
}
# remote_left LOG: stage processes of that run still alive on any host (the
# namespaces share this pid space; the run's shm prefix is on their lines);
# "?" when the log names no prefix (nothing can be counted: not a 0)
remote_left() {
  local prefix
  prefix=$(run_prefix "$1")
  [ -n "$prefix" ] || { echo "?"; return; }
  pgrep -f -- "--shm-prefix $prefix( |\$)" | wc -l
}
# nothing_left NAME LOG: no stage (local ssh client or remote stage) and no shm
nothing_left() {
  local r; r=$(remote_left "$2")
  if [ "$r" = "?" ]; then fail "$1: $2 names no shm prefix: remote stages not counted"
  elif [ "$r" -eq 0 ]; then ok "$1: no remote stage left"
  else fail "$1: $r remote stages left"; pgrep -af -- --shm-prefix; fi
  left_behind "$1" "$2"
}
# The failure cases every launcher across the namespace hosts must pass, for
# the plan in $W/plan.yaml (text on tx at 10.77.0.4), the coordinator in the
# coordinator's namespace; VIA is what the log says started a stage ("ssh",
# "agent"). Each ends with nothing_left.
# case_stage_killed WHERE LAUNCH...: SIGKILL of the remote text stage:
# noticed, named with WHERE (how it was started and on which host, as the
# coordinator's log says it: "agent to host tx at 10.77.0.4"), the job
# stopped. LAUNCH is the command up to and including "launch PLAN".
case_stage_killed() {
  local where=$1 cpid tpid rc
  shift
  "$@" --out "$W/kill" --set job.steps=400 >"$W/kill.log" 2>&1 &
  cpid=$!
  wait_step "$W/kill/metrics.jsonl" 2 60 || fail "kill: no step 2"
  tpid=$(stage_pid "$W/kill.log" text.0)
  if [ -n "$tpid" ]; then kill -9 "$tpid"; else fail "kill: no pid for this run's text.0/0"; kill $cpid; fi
  wait $cpid; rc=$?
  [ $rc -ne 0 ] && grep -q "stage text.0/0 (pid [0-9]*, $where) died" "$W/kill.log" \
    && ok "killed remote stage named with its host (rc $rc)" || { fail "kill: rc $rc"; tail -5 "$W/kill.log"; }
  sleep 1
  nothing_left kill "$W/kill.log"
}
# case_restarted WHAT LAUNCH...: with train.max_restarts, a SIGKILL of the
# text stage mid-run makes the coordinator relaunch every stage (WHAT says
# through what, for the log) from the latest checkpoint; the run finishes
# (rc 0) and equals --single-process. LAUNCH is the command up to and
# including "launch PLAN"; the run's options are appended. The new stages
# connect under the old names, often on the dead connections' descriptor
# numbers: they must not count as lost. 200 steps: a step of the test plans
# takes about 8 ms, and with 12 the kill after step 4 sometimes came after
# the last step (rc 0, no restart).
case_restarted() {
  local what=$1 steps=200 cpid tpid rc at
  shift
  "$@" --out "$W/rs" --set job.steps=$steps --set train.ckpt_every=5 --set train.max_restarts=2 \
    >"$W/rs.log" 2>&1 &
  cpid=$!
  wait_step "$W/rs/metrics.jsonl" 7 60 || fail "rs: no step 7"
  tpid=$(stage_pid "$W/rs.log" text.0)
  if [ -n "$tpid" ]; then kill -9 "$tpid"; else fail "rs: no pid for this run's text.0/0"; fi
  at=$(last_step "$W/rs/metrics.jsonl")
  wait $cpid; rc=$?
  "$BIN" launch "$W/plan.yaml" --out "$W/rs-single" --single-process --set job.steps=$steps \
    --set train.ckpt_every=5 >"$W/rs-single.log" 2>&1 || fail "rs: single"
  [ $rc -eq 0 ] && grep -q 'restart 1 of 2 after step' "$W/rs.log" && ! grep -q ') lost: ' "$W/rs.log" \
    && ok "restart: the killed stage's job relaunched $what and finished (rc 0)" \
    || { fail "restart: rc $rc (killed after step $at of $steps)"; grep -E 'error|restart' "$W/rs.log" | tail -4; }
  same_ckpt "$W/rs/ckpt/latest" "$W/rs-single/ckpt/latest" && ok "restart: == single process" \
    || fail "restart: != single process"
  nothing_left rs "$W/rs.log"
}
# case_replica_lost WHAT LAUNCH...: with train.max_restarts, a SIGKILL of image
# replica 1 (its sibling, replica 0, lives on elsewhere) mid-run: the step every
# other stage holds is checkpointed, though none was due (ckpt_every 1000), and
# the restart starts there, not at step 0; the run finishes and equals
# --single-process. LAUNCH as for case_restarted.
case_replica_lost() {
  local what=$1 steps=200 cpid vpid rc at from p
  shift
  "$@" --out "$W/rl" --set job.steps=$steps --set train.ckpt_every=1000 --set train.max_restarts=2 \
    >"$W/rl.log" 2>&1 &
  cpid=$!
  wait_step "$W/rl/metrics.jsonl" 7 60 || fail "rl: no step 7"
  p=$(run_prefix "$W/rl.log")
  vpid=
  [ -n "$p" ] && vpid=$(pgrep -f -- "--stage image.0 --replica 1 --shm-prefix $p( |\$)" | head -1)
  at=$(last_step "$W/rl/metrics.jsonl")
  if [ -n "$vpid" ]; then kill -9 "$vpid"; else fail "rl: no pid for this run's image.0/1"; fi
  wait $cpid; rc=$?
  from=$(grep -o 'relaunching every stage from step [0-9]*' "$W/rl.log" | head -1 | grep -o '[0-9]*$')
  "$BIN" launch "$W/plan.yaml" --out "$W/rl-single" --single-process --set job.steps=$steps \
    >"$W/rl-single.log" 2>&1 || fail "rl: single"
  [ $rc -eq 0 ] && grep -q 'keeping what was trained: checkpointing step [0-9]* from the replicas left' "$W/rl.log" \
    && [ "${from:-0}" -ge "$at" ] && [ "$at" -ge 7 ] \
    && ok "a lost replica, $what: step $from kept (killed after step $at), the restart starts there" \
    || { fail "replica lost: rc $rc, killed after step $at, restart from '${from:-}'"; grep -E 'keep|relaunch|warn|error' "$W/rl.log" | tail -4; }
  same_ckpt "$W/rl/ckpt/latest" "$W/rl-single/ckpt/latest" && ok "replica lost: == single process" \
    || fail "replica lost: != single process"
  nothing_left rl "$W/rl.log"
}
# case_sigint: Ctrl-C (SIGINT to the coordinator): the step in flight
# finishes, is checkpointed, every stage on every host ends; exit 130.
case_sigint() {
  local cpid rc
  ip netns exec "${P}c" "$BIN" launch "$W/plan.yaml" --out "$W/int" --set job.steps=400 >"$W/int.log" 2>&1 &
  cpid=$!
  wait_step "$W/int/metrics.jsonl" 2 60 || fail "int: no step 2"
  kill -INT $cpid; wait $cpid; rc=$?
  [ $rc -eq 130 ] && [ -e "$W/int/ckpt/latest" ] && ok "SIGINT: checkpoint and exit 130" \
    || { fail "SIGINT: rc $rc"; tail -5 "$W/int.log"; }
  nothing_left int "$W/int.log"
}
# case_coordinator_killed: the coordinator SIGKILLed: its pipes close, the
# launcher (ssh, the agent's relay) passes the end of file on, every remote
# stage removes its shm and exits.
case_coordinator_killed() {
  local cpid i
  ip netns exec "${P}c" "$BIN" launch "$W/plan.yaml" --out "$W/ck" --set job.steps=400 >"$W/ck.log" 2>&1 &
  cpid=$!
  wait_step "$W/ck/metrics.jsonl" 2 60 || fail "ck: no step 2"
  kill -9 $cpid; wait $cpid 2>/dev/null
  for i in $(seq 100); do [ "$(remote_left "$W/ck.log")" = 0 ] && break; sleep 0.1; done
  [ "$(remote_left "$W/ck.log")" = 0 ] && ok "coordinator SIGKILLed: remote stages gone within $i tenths of a second" \
    || fail "coordinator SIGKILLed: remote stages still running after 10 s"
  nothing_left ck "$W/ck.log"
}
# case_link_down VIA BOUND: fusion's host (fu, 10.77.0.5) loses its link
# mid-run: the stage and its host named, the job stopped within BOUND
# seconds; the cut-off stage ends on its own (its heartbeat, MMP_CTL_LOST_S,
# 7 s, or its launcher's keepalive); the link comes back after.
case_link_down() {
  local cpid rc t0 dt i
  ip netns exec "${P}c" "$BIN" launch "$W/plan.yaml" --out "$W/down" --set job.steps=400 >"$W/down.log" 2>&1 &
  cpid=$!
  wait_step "$W/down/metrics.jsonl" 2 60 || fail "down: no step 2"
  t0=$(date +%s.%N)
  ip netns exec "${P}fu" ip link set eth0 down
  wait $cpid; rc=$?
  dt=$(echo "$(date +%s.%N) - $t0" | bc)
  grep -q "fusion/0 (pid [0-9]*, $1 to host fu at 10.77.0.5)" "$W/down.log" && [ $rc -ne 0 ] \
    && [ "$(echo "$dt < $2" | bc)" -eq 1 ] \
    && ok "lost host named, job stopped after ${dt}s (rc $rc, bound $2 s)" \
    || { fail "down: rc $rc after ${dt}s"; tail -5 "$W/down.log"; }
  for i in $(seq 300); do [ "$(remote_left "$W/down.log")" = 0 ] && break; sleep 0.1; done
  nothing_left down "$W/down.log"
  ip netns exec "${P}fu" ip link set eth0 up
}
