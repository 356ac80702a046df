#!/usr/bin/env bash
# ctest-labels: slow
# The slurm launcher inside a real allocation: munged, slurmctld and slurmd
# (Debian's munge and slurm-wlm) started by this test with its own key,
# config, ports and state under $W (nothing in /etc touched), one node (this
# machine: Debian's slurmd runs one node per host). Checked: `hosts: slurm`
# outside an allocation is a clear error; inside `salloc`, `--set
# launcher=slurm --set hosts=slurm` starts each stage as an srun step and the
# checkpoint equals --single-process (max_abs_diff=0); a SIGKILLed stage is
# named with its srun host and the job stops; nothing is left (processes,
# /dev/shm, daemons). Several nodes (hostlist expansion, one step per node)
# are unit-tested only: tests/test_hostlist.c, tests/test_launcher.c.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
BIN=$(realpath "$BIN")
for d in munged slurmctld slurmd salloc srun; do
  command -v "$d" >/dev/null || { fail "$d not installed (scripts/setup installs munge, slurm-wlm)"; finish; exit 1; }
done
S=$W/slurm
mkdir -p "$S/state" "$S/spool"
# ours: a process whose environment names this test's slurm.conf (slurmstepd
# ignores SIGTERM and may outlive a step whose srun was killed)
ours() {
  local p
  for p in $(pgrep -x "$1"); do
    { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "SLURM_CONF=$S/slurm.conf" && echo "$p"
  done
}
cleanup() {
  local f p i
  scancel --quiet --full --user=root 2>/dev/null
  for f in slurmd slurmctld munged; do [ -f "$S/$f.pid" ] && kill "$(cat "$S/$f.pid" 2>/dev/null)" 2>/dev/null; done
  for i in $(seq 20); do
    [ -z "$(ours slurmd)$(ours slurmctld)" ] && break
    sleep 0.1
  done
  # what did not end on SIGTERM (slurmstepd ignores it; slurmd may wait on one)
  for f in slurmstepd slurmd slurmctld; do for p in $(ours $f); do kill -9 "$p" 2>/dev/null; done; done
  [ -f "$S/munged.pid" ] && kill -9 "$(cat "$S/munged.pid" 2>/dev/null)" 2>/dev/null
  return 0
}
trap cleanup EXIT
head -c 1024 /dev/urandom >"$S/munge.key" && chmod 400 "$S/munge.key"
munged -f --key-file="$S/munge.key" --socket="$S/munge.sock" --pid-file="$S/munged.pid" \
  --log-file="$S/munged.log" --seed-file="$S/munge.seed" || fail "munged"
node=$(hostname -s)
port=$((20000 + RANDOM % 20000))
cat >"$S/slurm.conf" <<CONF
ClusterName=mmptest
SlurmctldHost=$node
AuthType=auth/munge
AuthInfo=socket=$S/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.log
SlurmctldPort=$port
SlurmdPort=$((port + 1))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
NodeName=$node CPUs=$(nproc) State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
export SLURM_CONF=$S/slurm.conf
slurmctld -c -i || fail "slurmctld"
slurmd || fail "slurmd"
for i in $(seq 100); do sinfo -h -o %t 2>/dev/null | grep -q idle && break; sleep 0.1; done
sinfo -h -o %t | grep -q idle && ok "slurm daemons up (node $node)" || { fail "slurm not idle"; tail -3 "$S"/*.log; }

synth 200 4
tiny_plan "name: slurm, steps: 6, seed: 5" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 32" \
  2 "batch: 16, microbatches: 4, eval_every: 0, ckpt_every: 0" \
  "control: { address: 127.0.0.1 }"
expect_fail "hosts: slurm outside an allocation" "hosts: slurm: not inside a SLURM allocation" \
  env -u SLURM_JOB_NODELIST -u SLURM_JOB_ID "$BIN" launch "$W/plan.yaml" --out "$W/none" \
  --set launcher=slurm --set hosts=slurm
expect_fail "launcher: slurm outside an allocation" "launcher: slurm: not inside a SLURM allocation" \
  env -u SLURM_JOB_NODELIST -u SLURM_JOB_ID "$BIN" launch "$W/plan.yaml" --out "$W/none2" \
  --set launcher=slurm

timeout 300 salloc -N1 -Q "$BIN" launch "$W/plan.yaml" --out "$W/srun" --set launcher=slurm \
  --set hosts=slurm >"$W/srun.log" 2>&1 && ok "launch inside salloc" || { fail "salloc launch"; tail -5 "$W/srun.log"; }
grep -q "started fusion/0 (pid [0-9]*, srun to host $node" "$W/srun.log" && ok "stages started as srun steps" \
  || fail "no srun steps in the log"
"$BIN" launch "$W/plan.yaml" --out "$W/single" --single-process >"$W/single.log" 2>&1 || fail "single"
same_ckpt "$W/srun/ckpt/latest" "$W/single/ckpt/latest" && ok "slurm launcher == single process" \
  || fail "slurm launcher != single process"
left_behind srun "$W/srun.log"

# a stage SIGKILLed inside its srun step
timeout 300 salloc -N1 -Q "$BIN" launch "$W/plan.yaml" --out "$W/kill" --set launcher=slurm \
  --set hosts=slurm --set job.steps=400 >"$W/kill.log" 2>&1 &
cpid=$!
wait_step "$W/kill/metrics.jsonl" 2 60 || fail "kill: no step 2"
prefix=$(grep -o 'shared memory /mmpipe-[0-9a-f]*' "$W/kill.log" | head -1 | sed 's/.*memory //')
# Only with this run's prefix: an empty one would match any test's text.0/0.
[ -n "$prefix" ] && kill -9 "$(pgrep -f -- "--stage text.0 --replica 0 --shm-prefix $prefix" | head -1)"
wait $cpid; rc=$?
[ $rc -ne 0 ] && grep -q "stage text.0/0 (pid [0-9]*, srun to host $node at $node) died" "$W/kill.log" \
  && ok "killed srun stage named (rc $rc)" || { fail "kill: rc $rc"; tail -5 "$W/kill.log"; }
sleep 1
[ "$(pgrep -f -- "--shm-prefix $prefix" | wc -l)" -eq 0 ] && ok "kill: no stage left" || fail "kill: stages left"
left_behind kill "$W/kill.log"
cleanup
for i in $(seq 50); do
  n=0
  for d in slurmd slurmctld slurmstepd; do n=$((n + $(ours $d | wc -l))); done
  [ $n -eq 0 ] && break
  sleep 0.1
done
if [ $n -eq 0 ]; then ok "slurm daemons and steps stopped"; else
  fail "$n slurm processes of this test left"
  for d in slurmd slurmctld slurmstepd; do for p in $(ours $d); do ps -o pid,ppid,stat,args -p "$p" | tail -1; done; done
fi
finish
