#!/usr/bin/env bash
# The tcp data plane, forced on one host (transport.data: tcp, over
# loopback): every channel and the replicas' gradient reduce go through
# transport/tcp.c and transport/reduce_tcp.c, the creators' ports travel
# through the coordinator (Endpoints). The checkpoints equal --single-process
# bitwise (gpipe, 1f1b, a split image branch, 2 image replicas); the stages'
# logs say tcp; nothing is left in /dev/shm; a SIGKILLed stage stops the job
# with the stage named (whether its peers' channels report the lost address
# before the coordinator stops them is a race: test_transport tcp/peer-death
# checks those messages). A plan of 20 "hosts" of this machine (more than the
# 16 a plan once held), 18 processes over tcp, = --single-process bitwise.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 400 4
tiny_plan "name: t, steps: 12, seed: 7" \
  "manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 32" \
  2 "batch: 16, microbatches: 4, optimizer: { lr: 1.0e-3, warmup: 5 }, eval_every: 6, clip_grad_norm: 0.5" \
  "transport: { data: tcp }"

"$BIN" launch "$W/plan.yaml" --single-process --out "$W/single" >"$W/single.log" 2>&1 \
  || { fail "single-process run"; tail -3 "$W/single.log"; }
run() { # NAME [--set ...]: a tcp pipeline run into $W/NAME, same_ckpt against the single process
  local name=$1; shift
  "$BIN" launch "$W/plan.yaml" --out "$W/$name" "$@" >"$W/$name.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then fail "$name: launch rc=$rc"; tail -5 "$W/$name.log" | sed 's/^/    /'; return; fi
  local out; out=$(same_ckpt "$W/single" "$W/$name") && ok "$name over tcp vs single-process: $out" \
    || fail "$name over tcp differs from single-process: $out"
}
run gpipe --set train.schedule=gpipe
run 1f1b --set train.schedule=1f1b
run split --set 'stages.image.split=[1]'
run replicas --set 'stages.image.replicas=2'

grep -q 'data channels: 0 over cuda_ipc, 0 over shm, 4 over tcp' "$W/1f1b.log" \
  && ok "every channel of the 3-stage run is tcp" || fail "channels: $(grep -o 'data channels:.*' "$W/1f1b.log")"
grep -q 'data channels: 0 over cuda_ipc, 0 over shm, 6 over tcp' "$W/replicas.log" \
  && ok "every channel of the replicated run is tcp" || fail "channels: $(grep -o 'data channels:.*' "$W/replicas.log")"
# the 2 replicas' reduce went over tcp: rank 0 listened on a port it chose, and
# rank 1 was given that same address through the coordinator
r0=$(grep -o "image.0/0: replicas' reduce over tcp via 127.0.0.1:[0-9]* (rank 0 of 2)" "$W/replicas.log" | grep -o '127.0.0.1:[0-9]*')
r1=$(grep -o "image.0/1: replicas' reduce over tcp via 127.0.0.1:[0-9]* (rank 1 of 2)" "$W/replicas.log" | grep -o '127.0.0.1:[0-9]*')
[ -n "$r0" ] && [ "$r0" = "$r1" ] && [ "${r0#127.0.0.1:}" != 0 ] && ok "the replicas reduced over tcp via $r0" \
  || fail "reduce over tcp: rank 0 '$r0', rank 1 '$r1'"
# (the runs' own segment prefixes, from their logs: other tests may run beside this one)
[ "$(grep -c 'shared memory /mmpipe-' "$W"/*.log | awk -F: '{n += $2} END {print n + 0}')" -gt 0 ] \
  && [ "$(shm_left "$W"/*.log)" -eq 0 ] \
  && ok "nothing in /dev/shm after the tcp runs" || fail "shm left: $(ls /dev/shm | grep mmpipe)"
[ "$(procs_left "$W"/*.log)" -eq 0 ] && ok "no stage processes left" || fail "stage processes left"

# --- same plan, auto: one host means shm, and the same bits -----------------------------
"$BIN" launch "$W/plan.yaml" --out "$W/auto" --set transport.data=auto >"$W/auto.log" 2>&1 \
  || { fail "auto run"; tail -3 "$W/auto.log"; }
grep -q 'data channels: 0 over cuda_ipc, 4 over shm, 0 over tcp' "$W/auto.log" \
  && ok "transport.data: auto on one host is shm" || fail "auto: $(grep -o 'data channels:.*' "$W/auto.log")"
expect_fail "a bad transport.data is named" "transport.data" \
  "$BIN" launch "$W/plan.yaml" --out "$W/bad" --set transport.data=carrier-pigeon

# --- more hosts than the 16 a plan once held: 20 "hosts" of this machine --------------
# (launcher: ssh with `env MMP_HOST={address} sh -c` for a command: each
# host's stages start here, and an edge between two hosts is tcp); 18
# processes on 18 of them:
# image.0 x8, image.1 x8, text, fusion = --single-process bitwise
{
  cat <<YAML
job:   { name: many, steps: 4, seed: 7 }
data:  { manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 32 }
model: { width: 32, image: { blocks: [1, 1], channels: [8, 16] },
         text: { layers: 1, heads: 2 }, fusion: { layers: 1, heads: 2 } }
train: { batch: 16, microbatches: 8, eval_every: 0, ckpt_every: 0, final_eval: false }
stages: { image: { split: [1], replicas: [8, 8] } }
launcher: ssh
launcher_command: env MMP_HOST={address} sh -c
control: { address: 127.0.0.1 }
hosts:
YAML
  for h in $(seq -w 0 19); do echo "  - { name: h$h, address: 127.0.0.1, devices: [cpu] }"; done
} >"$W/many.yaml"
"$BIN" launch "$W/many.yaml" --single-process --out "$W/many-single" >"$W/many-single.log" 2>&1 \
  || { fail "20 hosts: single"; tail -3 "$W/many-single.log"; }
"$BIN" launch "$W/many.yaml" --out "$W/many" >"$W/many.log" 2>&1 \
  && ok "20 hosts: 18 stage processes on 18 hosts ran" || { fail "20 hosts: launch"; tail -5 "$W/many.log"; }
grep -q 'started fusion/0 (pid [0-9]*, ssh to host h17 at 127.0.0.1)' "$W/many.log" \
  && grep -q 'data channels: 0 over cuda_ipc, 0 over shm, [1-9][0-9]* over tcp' "$W/many.log" \
  && ok "20 hosts: fusion on the 18th host, every channel tcp" \
  || fail "20 hosts: $(grep -o 'started fusion[^)]*)' "$W/many.log"); $(grep -o 'data channels:.*' "$W/many.log")"
out=$(same_ckpt "$W/many-single" "$W/many") && ok "20 hosts == single process: $out" \
  || fail "20 hosts != single process: $out"
left_behind "20 hosts" "$W/many.log"

# --- SIGKILL to one stage: noticed, named, nothing left ---------------------------------
for victim in text.0 fusion; do
  kill_stage "SIGKILL $victim over tcp" "$W/plan.yaml" "$W/kill_$victim" "$victim"
done
finish
