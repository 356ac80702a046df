#!/usr/bin/env bash
# ctest-labels: slow
# The slurm launcher inside real allocations of a four-node SLURM cluster
# that this test makes on one machine: Debian's munge and slurm-wlm, a
# slurmctld in the network namespace "ctl" (10.77.0.1) and one slurmd per
# node n1..n4 (10.77.0.2..5), each in a network and UTS namespace of its own
# (its host name is its node name), joined by a bridge (tests/hosts_lib.sh).
# The node names resolve through an /etc/hosts of this test's own, bind-
# mounted in a private mount namespace; key, config, ports, state and logs
# live under $W (nothing in /etc touched). Checked:
#  1. `hosts: slurm` / `launcher: slurm` outside an allocation: clear errors;
#     inside salloc (two stand-in GPUs a node, SLURM's gres), the nodes' GPUs
#     from --gpus-per-node (all the login node's shell is told), what a step
#     sees (CUDA_VISIBLE_DEVICES=0,1), --gpus=N refused (no per-node count);
#  2. `salloc -N3` + `--set launcher=slurm --set hosts=slurm`: image, text
#     and fusion each an srun step on its own node, every data channel over
#     tcp, the checkpoint equals --single-process (max_abs_diff=0); the same
#     with the coordinator itself in an srun step on n1;
#  3. `salloc -N4` with two image replicas: the replicas on two nodes reduce
#     their gradients over tcp, = --single-process bitwise; a scripted
#     re-placement (new srun steps after a checkpoint) = --single-process;
#  4. the sample batch script configs/slurm.sbatch under `sbatch --wait`:
#     the coordinator on the batch node (n1), the stages reaching it by its
#     host name (control.address's default), = --single-process bitwise;
#     and a long one stopped by `scancel --batch --signal=INT`: checkpoint,
#     exit 130;
#  5. a stage SIGKILLed inside its srun step: named with its node, the job
#     stops; with train.max_restarts it restarts and = --single-process;
#  6. a node's link taken down mid-run: the coordinator names the stage and
#     its node within 15 s (its control connection dropped: ZMTP heartbeats
#     unanswered) and the job stops;
#  7. SIGINT to the coordinator: checkpoint, exit 130; SIGINT to salloc:
#     the allocation revoked, every step ended by SLURM, no checkpoint;
#  8. the coordinator SIGKILLed: every stage and srun gone;
# and after each run: no stage process and no /dev/shm entry left; at the
# end no slurm daemon, step or namespace left. Skips (77) where namespaces
# cannot be made (not root).
cd "$(dirname "$0")/.." || exit 1
# A private mount namespace for the test's /etc/hosts (the daemons, salloc,
# srun and the stages inherit it; it ends with the test's last process).
if [ -z "${MMP_SLURM_MNTNS:-}" ]; then
  [ "$(id -u)" -eq 0 ] || { echo "skip: needs root (namespaces)"; exit 77; }
  unshare --mount --propagation private true 2>/dev/null \
    || { echo "skip: cannot make a mount namespace here"; exit 77; }
  exec unshare --mount --propagation private env MMP_SLURM_MNTNS=1 bash "$0" "$@"
fi
. tests/lib.sh
. tests/hosts_lib.sh # hosts_up, hosts_down, ipc, nothing_left, case_stage_killed, case_restarted
workdir
BIN=$(realpath "$BIN")
for d in munged slurmctld slurmd salloc srun sbatch scancel sinfo; do
  command -v "$d" >/dev/null || { fail "$d not installed (scripts/setup installs munge, slurm-wlm)"; finish; exit 1; }
done
S=$W/slurm
NODES=(n1 n2 n3 n4)
mkdir -p "$S/state"
# ours NAME: the processes NAME whose environment names this test's
# slurm.conf (slurmstepd ignores SIGTERM and may outlive a killed srun)
ours() {
  local p
  for p in $(pgrep -x "$1"); do
    { tr '\0' '\n' <"/proc/$p/environ"; } 2>/dev/null | grep -qx "SLURM_CONF=$S/slurm.conf" && echo "$p"
  done
}
slurm_down() {
  local f p i
  [ -f "$S/slurm.conf" ] && ipc scancel --quiet --full --user=root 2>/dev/null
  for f in "$S"/slurmd.*.pid "$S/slurmctld.pid"; do [ -f "$f" ] && kill "$(cat "$f" 2>/dev/null)" 2>/dev/null; done
  for i in $(seq 30); do
    [ -z "$(ours slurmd)$(ours slurmctld)" ] && break
    sleep 0.1
  done
  # what did not end on SIGTERM (slurmstepd ignores it; slurmd may wait on one)
  for f in slurmstepd slurmd slurmctld; do for p in $(ours $f); do kill -9 "$p" 2>/dev/null; done; done
  [ -f "$S/munged.pid" ] && kill -9 "$(cat "$S/munged.pid" 2>/dev/null)" 2>/dev/null
  return 0
}
trap 'slurm_down; hosts_down' EXIT
HOSTS_SSHD=0 hosts_up "${NODES[@]}"; rc=$?
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || { fail "namespace hosts: rc $rc"; finish; exit 1; }
# the names: this machine's /etc/hosts and the cluster's, bound over it here only
{ cat /etc/hosts; echo "10.77.0.1 ctl"; for i in "${!NODES[@]}"; do echo "10.77.0.$((i + 2)) ${NODES[$i]}"; done; } >"$W/hosts"
mount --bind "$W/hosts" /etc/hosts || { fail "bind-mount of the test's /etc/hosts"; finish; exit 1; }
# in_ns NS NAME CMD...: CMD in namespace host NS's network, under host name NAME
# (nsenter, not ip netns exec: slurmd needs this machine's /sys/fs/cgroup)
in_ns() {
  local ns=$1 name=$2; shift 2
  nsenter --net="/run/netns/${P}$ns" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$name" "$@"
}

head -c 1024 /dev/urandom >"$S/munge.key" && chmod 400 "$S/munge.key"
munged -f --key-file="$S/munge.key" --socket="$S/munge.sock" --pid-file="$S/munged.pid" \
  --log-file="$S/munged.log" --seed-file="$S/munge.seed" || fail "munged"
port=$((20000 + RANDOM % 20000))
cat >"$S/slurm.conf" <<CONF
ClusterName=mmptest
SlurmctldHost=ctl(10.77.0.1)
AuthType=auth/munge
AuthInfo=socket=$S/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$S/state
SlurmdSpoolDir=$S/spool.%n
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.%n.pid
SlurmctldLogFile=$S/slurmctld.log
SlurmdLogFile=$S/slurmd.%n.log
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
GresTypes=gpu
NodeName=n[1-${#NODES[@]}] CPUs=$(nproc) Gres=gpu:2 State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF
# two stand-in GPUs a node (character devices no driver serves: SLURM only
# counts them and sets the steps' CUDA_VISIBLE_DEVICES; no stage here opens them)
mkdir -p "$S/dev" && mknod "$S/dev/nvidia0" c 195 0 && mknod "$S/dev/nvidia1" c 195 1 || fail "mknod"
echo "NodeName=n[1-${#NODES[@]}] Name=gpu File=$S/dev/nvidia[0-1]" >"$S/gres.conf"
export SLURM_CONF=$S/slurm.conf
in_ns c ctl slurmctld -c -i || fail "slurmctld"
for n in "${NODES[@]}"; do
  mkdir -p "$S/spool.$n"
  in_ns "$n" "$n" slurmd || fail "slurmd on $n"
done
for i in $(seq 150); do [ "$(ipc sinfo -h -o %t 2>/dev/null)" = idle ] && break; sleep 0.2; done
[ "$(ipc sinfo -h -o '%D %t' 2>/dev/null)" = "${#NODES[@]} idle" ] && ok "slurm cluster up: ${#NODES[@]} nodes idle" \
  || { fail "slurm not idle: $(ipc sinfo -h -o '%D %t %N' 2>&1 | tr '\n' ' ')"; tail -3 "$S"/*.log; }

synth 200 4
DATA="manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 32"
TRAIN="batch: 16, microbatches: 4, eval_every: 0, ckpt_every: 0"
# the batch script's plan: the coordinator runs on the batch node, and the
# stages reach it by that node's host name (control.address's default)
tiny_plan "name: slurm, steps: 6, seed: 5" "$DATA" 2 "$TRAIN"
cp "$W/plan.yaml" "$W/plan-batch.yaml"
# salloc's plan: the coordinator runs on the "login node" ctl
tiny_plan "name: slurm, steps: 6, seed: 5" "$DATA" 2 "$TRAIN" "control: { address: 10.77.0.1 }"

# 1. outside an allocation
expect_fail "hosts: slurm outside an allocation" "hosts: slurm: not inside a SLURM allocation" \
  env -u SLURM_JOB_NODELIST -u SLURM_JOB_ID "$BIN" launch "$W/plan.yaml" --out "$W/none" \
  --set launcher=slurm --set hosts=slurm
expect_fail "launcher: slurm outside an allocation" "launcher: slurm: not inside a SLURM allocation" \
  env -u SLURM_JOB_NODELIST -u SLURM_JOB_ID "$BIN" launch "$W/plan.yaml" --out "$W/none2" \
  --set launcher=slurm
"$BIN" launch "$W/plan.yaml" --out "$W/single" --single-process >"$W/single.log" 2>&1 || fail "single"

# 1b. GPUs, seen from salloc's shell on the login node: SLURM sets only the
# request there (SLURM_GPUS_PER_NODE), each node's count in the steps
sim() { # ARGS...: what the planner sees of `hosts: slurm` inside salloc ARGS
  timeout 60 ip netns exec "${P}c" salloc -Q "$@" "$BIN" simulate "$W/plan.yaml" --set hosts=slurm \
    --plan-devices all 2>&1 | grep -E 'planner: [0-9]+ devices|hosts: slurm:' | head -1
}
got=$(sim -N2 --gpus-per-node=2)
grep -q 'planner: 4 devices' <<<"$got" && ok "salloc -N2 --gpus-per-node=2: hosts: slurm has 2 GPUs on each of 2 nodes" \
  || fail "salloc --gpus-per-node=2: '$got'"
got=$(timeout 60 ip netns exec "${P}c" salloc -Q -N1 --gpus-per-node=2 srun --overlap -N1 -n1 --quiet \
  sh -c 'echo "$CUDA_VISIBLE_DEVICES"' 2>&1)
[ "$got" = "0,1" ] && ok "a step on that node sees CUDA_VISIBLE_DEVICES=0,1 (the stages' cuda:0, cuda:1)" \
  || fail "a step's CUDA_VISIBLE_DEVICES: '$got'"
got=$(sim -N2 --gpus=2)
grep -q 'SLURM_GPUS=2.*--gpus-per-node' <<<"$got" && ok "salloc --gpus=2: refused, naming SLURM_GPUS and --gpus-per-node" \
  || fail "salloc --gpus=2: '$got'"
got=$(sim -N2 --ntasks-per-node=2)
grep -q 'planner: 4 devices' <<<"$got" && ok "salloc -N2 --ntasks-per-node=2 (no GPUs): 2 cpu slots on each node" \
  || fail "cpu slots: '$got'"

# 2. three nodes: image, text, fusion one on each
timeout 300 ip netns exec "${P}c" salloc -N3 --ntasks-per-node=1 -Q "$BIN" launch "$W/plan.yaml" --out "$W/n3" \
  --set launcher=slurm --set hosts=slurm >"$W/n3.log" 2>&1 && ok "launch inside salloc -N3" \
  || { fail "salloc -N3 launch"; tail -5 "$W/n3.log"; }
grep -q 'image.0/0 (pid [0-9]*, srun to host n1' "$W/n3.log" && grep -q 'text.0/0 (pid [0-9]*, srun to host n2' "$W/n3.log" \
  && grep -q 'fusion/0 (pid [0-9]*, srun to host n3' "$W/n3.log" && ok "n3: one srun step a stage, on nodes n1, n2, n3" \
  || { fail "n3: placement over the nodes"; grep started "$W/n3.log"; }
grep -q 'data channels: 0 over cuda_ipc, 0 over shm, [1-9][0-9]* over tcp' "$W/n3.log" \
  && ok "n3: every data channel over tcp between nodes" || fail "n3: $(grep 'data channels' "$W/n3.log")"
same_ckpt "$W/n3/ckpt/latest" "$W/single/ckpt/latest" && ok "n3: three nodes == single process" \
  || fail "n3: three nodes != single process"
nothing_left n3 "$W/n3.log"

# 2b. the coordinator itself inside a step on the allocation's first node
# (`srun mmpipe launch`, as the GPU refusal above advises): its stages are
# steps of the same job, and they reach it by n1's host name
timeout 300 ip netns exec "${P}c" salloc -N3 --ntasks-per-node=1 -Q srun -N1 -n1 --overlap --quiet \
  "$BIN" launch "$W/plan-batch.yaml" --out "$W/instep" --set launcher=slurm --set hosts=slurm \
  >"$W/instep.log" 2>&1 && ok "launch inside an srun step" || { fail "instep"; tail -5 "$W/instep.log"; }
grep -q 'control plane: tcp://n1:[0-9]*' "$W/instep.log" && grep -q 'fusion/0 (pid [0-9]*, srun to host n3' "$W/instep.log" \
  && ok "instep: the coordinator on n1, the stages srun steps on n1..n3" || fail "instep: $(grep -m1 'control plane' "$W/instep.log")"
same_ckpt "$W/instep/ckpt/latest" "$W/single/ckpt/latest" && ok "instep: == single process" \
  || fail "instep: != single process"
nothing_left instep "$W/instep.log"

# 3. four nodes, the image replicas on n1 and n2
timeout 300 ip netns exec "${P}c" salloc -N4 --ntasks-per-node=1 -Q "$BIN" launch "$W/plan.yaml" --out "$W/rep" \
  --set launcher=slurm --set hosts=slurm --set 'stages={image: {replicas: 2}}' >"$W/rep.log" 2>&1 \
  && ok "launch inside salloc -N4, two image replicas" || { fail "salloc -N4 launch"; tail -5 "$W/rep.log"; }
grep -q 'image.0/0 (pid [0-9]*, srun to host n1' "$W/rep.log" && grep -q 'image.0/1 (pid [0-9]*, srun to host n2' "$W/rep.log" \
  && ok "rep: the image replicas on nodes n1 and n2" || { fail "rep: placement"; grep started "$W/rep.log"; }
grep -q 'reduce.* over tcp' "$W/rep.log" && ok "rep: the replicas reduce over tcp" \
  || fail "rep: no tcp reduce in the log: $(grep -i reduce "$W/rep.log" | head -2)"
"$BIN" launch "$W/plan.yaml" --out "$W/rep-single" --single-process --set 'stages={image: {replicas: 2}}' \
  >"$W/rep-single.log" 2>&1 || fail "rep: single"
same_ckpt "$W/rep/ckpt/latest" "$W/rep-single/ckpt/latest" && ok "rep: replicas on two nodes == single process" \
  || fail "rep: replicas on two nodes != single process"
nothing_left rep "$W/rep.log"

# 3b. a scripted re-placement (balance.force) under SLURM: checkpoint, stop,
# relaunch every stage as new srun steps on the allocation's nodes, resume;
# = --single-process bitwise
balance_plan "$W/bal.yaml" 16 0 'step: 8, set: "stages.image.replicas=[1,2]"'
echo "control: { address: 10.77.0.1 }" >>"$W/bal.yaml"
"$BIN" launch "$W/bal.yaml" --single-process --out "$W/bal-single" >"$W/bal-single.log" 2>&1 \
  || fail "bal: single"
timeout 300 ip netns exec "${P}c" salloc -N3 --ntasks-per-node=2 -Q "$BIN" launch "$W/bal.yaml" --out "$W/bal" \
  --set launcher=slurm --set hosts=slurm >"$W/bal.log" 2>&1 && ok "bal: a re-placement under SLURM completes" \
  || { fail "bal: salloc launch"; tail -5 "$W/bal.log"; }
grep -q 'started image.1/1 (pid [0-9]*, srun to host n[0-9]' "$W/bal.log" \
  && grep -q '"placement":"image.0\[0:2):1 image.1\[2:5):2 text.0:1 fusion:1"' "$W/bal/metrics.jsonl" \
  && ok "bal: after step 8 image.1's second replica runs as a new srun step" \
  || fail "bal: no re-placement ($(grep -c started "$W/bal.log") starts)"
same_ckpt "$W/bal/ckpt/latest" "$W/bal-single/ckpt/latest" && ok "bal: re-placed under SLURM == single process" \
  || fail "bal: != single process"
nothing_left bal "$W/bal.log"

# 4. the sample batch script, as a user submits it (its GPU request taken
# back: this cluster has none; the binary through MMPIPE, as it says)
sbatch_script=$PWD/configs/slurm.sbatch
jobid=$(cd "$W" && timeout 300 ip netns exec "${P}c" sbatch --wait --parsable -N3 --ntasks-per-node=1 \
  --gpus-per-node=0 --export=ALL,MMPIPE="$BIN" "$sbatch_script" "$W/plan-batch.yaml" 2>"$W/sbatch.err" | tail -1)
blog=$W/mmpipe-$jobid.log
if [ -n "$jobid" ] && [ -f "$blog" ] && [ -e "$W/runs/slurm-$jobid/ckpt/latest" ]; then
  ok "sbatch --wait configs/slurm.sbatch: job $jobid finished"
else
  fail "sbatch: job '${jobid}': $(tail -2 "$W/sbatch.err" "$blog" 2>/dev/null | tr '\n' ' ')"
fi
grep -q 'control plane: tcp://n1:[0-9]*' "$blog" 2>/dev/null && grep -q 'fusion/0 (pid [0-9]*, srun to host n3' "$blog" \
  && ok "sbatch: the coordinator on the batch node n1, reached by its host name" \
  || fail "sbatch: $(grep -m1 'control plane' "$blog" 2>/dev/null)"
same_ckpt "$W/runs/slurm-$jobid/ckpt/latest" "$W/single/ckpt/latest" && ok "sbatch: == single process" \
  || fail "sbatch: != single process"
nothing_left sbatch "$blog"

# 4b. a batch job stopped the way the README says: SIGINT to the batch step
# alone (scancel --batch; the script exec'd the coordinator), which
# checkpoints the step in flight and exits 130 (a plain scancel signals
# every step: the stages end with no checkpoint)
sed 's/steps: 6,/steps: 400,/' "$W/plan-batch.yaml" >"$W/plan-batch-long.yaml"
(cd "$W" && timeout 300 ip netns exec "${P}c" sbatch --wait --parsable -N3 --ntasks-per-node=1 --gpus-per-node=0 \
  --export=ALL,MMPIPE="$BIN" "$sbatch_script" "$W/plan-batch-long.yaml" >"$W/sbatch2.out" 2>"$W/sbatch2.err") &
spid=$!
for i in $(seq 100); do
  jobid2=$(head -1 "$W/sbatch2.out" 2>/dev/null)
  [ -n "$jobid2" ] && break
  sleep 0.1
done
wait_step "$W/runs/slurm-$jobid2/metrics.jsonl" 2 60 || fail "sbatch stop: no step 2 (job '$jobid2')"
ipc scancel --batch --signal=INT "$jobid2"
wait $spid; rc=$?
blog2=$W/mmpipe-$jobid2.log
[ $rc -eq 130 ] && grep -q 'stopped by Interrupt; checkpoint' "$blog2" && [ -e "$W/runs/slurm-$jobid2/ckpt/latest" ] \
  && ok "sbatch: scancel --batch --signal=INT checkpoints, the job exits 130" \
  || { fail "sbatch stop: rc $rc"; tail -4 "$blog2" "$W/sbatch2.err" 2>/dev/null; }
nothing_left "sbatch stop" "$blog2"

# 5. a stage SIGKILLed inside its srun step
case_stage_killed "srun to host n2 at n2" timeout 300 ip netns exec "${P}c" salloc -N3 --ntasks-per-node=1 -Q \
  "$BIN" launch "$W/plan.yaml" --set launcher=slurm --set hosts=slurm

# 5b. the same with train.max_restarts: the coordinator relaunches every
# srun step from the latest checkpoint and the run finishes = single process
case_restarted "as new srun steps" timeout 300 ip netns exec "${P}c" salloc -N3 --ntasks-per-node=1 -Q \
  "$BIN" launch "$W/plan.yaml" --set launcher=slurm --set hosts=slurm

# 6. a node's link goes down mid-run (fusion's node)
timeout 300 ip netns exec "${P}c" salloc -N3 --ntasks-per-node=1 -Q "$BIN" launch "$W/plan.yaml" --out "$W/down" \
  --set launcher=slurm --set hosts=slurm --set job.steps=400 >"$W/down.log" 2>&1 &
cpid=$!
wait_step "$W/down/metrics.jsonl" 2 60 || fail "down: no step 2"
node=$(grep -o 'started fusion/0 (pid [0-9]*, srun to host n[0-9]*' "$W/down.log" | grep -o 'n[0-9]*$')
t0=$(date +%s.%N)
ip netns exec "${P}${node:-n3}" ip link set eth0 down
wait $cpid; rc=$?
dt=$(echo "$(date +%s.%N) - $t0" | bc)
# its heartbeats unanswered for 5 s, then 2 s for its process to end: about
# 7 s; 15 s is the bound held here (srun itself would wait for SLURM to call
# the node down, minutes; before this check the stall watchdog took 60 s)
grep -q "stage fusion/0 (pid [0-9]*, srun to host $node at $node) lost: its control connection dropped" "$W/down.log" \
  && [ $rc -ne 0 ] && [ "$(echo "$dt < 15" | bc)" -eq 1 ] \
  && ok "down: the lost node $node named, the job stopped after ${dt}s (rc $rc)" \
  || { fail "down: rc $rc after ${dt}s (fusion on '${node}')"; tail -5 "$W/down.log"; }
sleep 8 # the cut-off stage: its heartbeat (MMP_CTL_LOST_S, 7 s) ends it
nothing_left down "$W/down.log"
ip netns exec "${P}${node:-n3}" ip link set eth0 up

# coord_pid OUT: the pid of the coordinator writing run directory OUT (under
# salloc: not salloc's, which on SIGINT revokes the allocation and ends every
# step at once; a terminal's Ctrl-C reaches the command salloc runs)
coord_pid() {
  local i p
  for i in $(seq 100); do
    p=$(pgrep -f -- "^$BIN launch $W/plan.yaml --out $1( |\$)" | head -1)
    [ -n "$p" ] && { echo "$p"; return 0; }
    sleep 0.1
  done
  return 1
}

# 7. Ctrl-C (SIGINT to the coordinator inside salloc): the step in flight is
# checkpointed, every srun step ends, exit 130
timeout 300 ip netns exec "${P}c" salloc -N3 --ntasks-per-node=1 -Q "$BIN" launch "$W/plan.yaml" --out "$W/int" \
  --set launcher=slurm --set hosts=slurm --set job.steps=400 >"$W/int.log" 2>&1 &
cpid=$!
wait_step "$W/int/metrics.jsonl" 2 60 || fail "int: no step 2"
kpid=$(coord_pid "$W/int") && kill -INT "$kpid" || fail "int: no coordinator process"
wait $cpid; rc=$?
[ $rc -eq 130 ] && [ -e "$W/int/ckpt/latest" ] && ok "SIGINT: checkpoint and exit 130 (through salloc)" \
  || { fail "SIGINT: rc $rc"; tail -5 "$W/int.log"; }
nothing_left int "$W/int.log"

# 7b. SIGINT to salloc itself: it revokes the allocation, SLURM ends every
# step at once; the run stops without a checkpoint, nothing left
timeout 300 ip netns exec "${P}c" salloc -N3 --ntasks-per-node=1 -Q "$BIN" launch "$W/plan.yaml" --out "$W/rv" \
  --set launcher=slurm --set hosts=slurm --set job.steps=400 >"$W/rv.log" 2>&1 &
cpid=$!
wait_step "$W/rv/metrics.jsonl" 2 60 || fail "rv: no step 2"
kpid=$(coord_pid "$W/rv") && spid=$(ps -o ppid= -p "$kpid" | tr -d ' ') && [ "$(ps -o comm= -p "$spid")" = salloc ] \
  && kill -INT "$spid" || fail "rv: no salloc above the coordinator"
wait $cpid; rc=$?
[ $rc -ne 0 ] && [ ! -e "$W/rv/ckpt/latest" ] && grep -q 'died' "$W/rv.log" \
  && ok "SIGINT to salloc: the steps end, no checkpoint (rc $rc)" || { fail "rv: rc $rc"; tail -4 "$W/rv.log"; }
nothing_left rv "$W/rv.log"

# 8. the coordinator SIGKILLed: its pipes close, srun passes the end of file
# on (and salloc, its command gone, ends the allocation): every stage exits
timeout 300 ip netns exec "${P}c" salloc -N3 --ntasks-per-node=1 -Q "$BIN" launch "$W/plan.yaml" --out "$W/ck" \
  --set launcher=slurm --set hosts=slurm --set job.steps=400 >"$W/ck.log" 2>&1 &
cpid=$!
wait_step "$W/ck/metrics.jsonl" 2 60 || fail "ck: no step 2"
kpid=$(coord_pid "$W/ck") && kill -9 "$kpid" || fail "ck: no coordinator process"
wait $cpid 2>/dev/null
for i in $(seq 150); do [ "$(remote_left "$W/ck.log")" = 0 ] && [ "$(procs_left "$W/ck.log")" = 0 ] && break; sleep 0.1; done
[ "$(remote_left "$W/ck.log")" = 0 ] && [ "$(procs_left "$W/ck.log")" = 0 ] \
  && ok "coordinator SIGKILLed: stages and their srun gone within $i tenths of a second" \
  || fail "coordinator SIGKILLed: $(remote_left "$W/ck.log") stages, $(procs_left "$W/ck.log") srun left after 15 s"
nothing_left ck "$W/ck.log"

slurm_down
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
