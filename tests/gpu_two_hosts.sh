#!/usr/bin/env bash
# GPU stages on two "hosts" of one machine and one GPU, joined by NCCL: the
# hosts ga and gb are both 127.0.0.1, and the plan's launcher command (env
# ... sh -c, no ssh) gives each host's processes their own NCCL_HOSTID, so
# NCCL takes them for two hosts and moves their bytes over its socket
# transport on loopback (it refuses two ranks on one GPU of one host).
# Image replica 0 on ga; image replica 1, text and fusion on gb (slots in
# order), all on cuda:0:
#  - image.0/0 <-> fusion run over nccl channels (activations one way,
#    gradients the other), the other 4 channels over cuda_ipc, and the image
#    replicas sum their gradients over the nccl reduce (all-gather, then the
#    rank-order sum on each device) beside its tcp side reduce;
#  - 12 steps equal --single-process on the same GPU bit for bit
#    (max_abs_diff=0), as every GPU pipeline must;
#  - nothing left behind.
# Time-sliced (MMP_GPU_SHARING=timeslice: MPS is gpu_pipeline's matter).
# Skips (77) where no CUDA device is visible or the build has no CUDA.
# MMP_TEST_DEVICE=cpu runs the same placement on the CPU (shm and tcp
# instead), a check of this script on a machine without a GPU: ctest's
# two_hosts_cpu (label cpu) runs it so in every build.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
dev=${MMP_TEST_DEVICE:-cuda:0}
if [ "$dev" != cpu ]; then
  "$BIN" devices 2>/dev/null | grep -q '^cuda:0' || { echo "no CUDA device: skipped"; exit 77; }
fi
BIN=$(realpath "$BIN")
W=$TMP/gpu_two_hosts
rm -rf "$W"; mkdir -p "$W"
"$BIN" data synth --out "$W/data" --samples 400 --seed 4 >/dev/null 2>&1 || { echo "synth failed"; exit 1; }
nccl="NCCL_SOCKET_IFNAME=lo NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 NCCL_IB_DISABLE=1 NCCL_NET=Socket"
cat > "$W/plan.yaml" <<YAML
job:   { name: two-hosts, steps: 12, seed: 5 }
data:  { manifest: $W/data/train.jsonl, image_size: 32, max_text_len: 24, val_samples: 32 }
model: { width: 32, image: { blocks: [1, 1], channels: [8, 16] },
         text: { layers: 2, heads: 2 }, fusion: { layers: 1, heads: 2 } }
train: { batch: 16, microbatches: 4, eval_every: 0, ckpt_every: 0, final_eval: false }
launcher: ssh
launcher_command: env NCCL_HOSTID=mmp-{name} $nccl MMP_HOST={address} sh -c
control: { address: 127.0.0.1 }
hosts:
  - { name: ga, address: 127.0.0.1, devices: [$dev], workdir: $PWD, binary: $BIN }
  - { name: gb, address: 127.0.0.1, devices: [$dev, $dev, $dev], workdir: $PWD, binary: $BIN }
stages: { image: { replicas: 2 } }
YAML
export MMP_GPU_SHARING=timeslice
"$BIN" launch "$W/plan.yaml" --out "$W/two" --force >"$W/two.log" 2>&1 && ok "two hosts ($dev): completed" \
  || { fail "two hosts ($dev) failed"; tail -12 "$W/two.log" | sed 's/^/    /'; }
grep -q 'image.0/1 (pid [0-9]*, ssh to host gb' "$W/two.log" && grep -q 'image.0/0 (pid [0-9]*, ssh to host ga' "$W/two.log" \
  && ok "image replica 0 on ga, replica 1 on gb" || fail "placement: $(grep -o 'started .*' "$W/two.log" | tr '\n' ';')"
if [ "$dev" = cpu ]; then
  want_ch="data channels: 0 over cuda_ipc, 4 over shm, 2 over tcp, 0 over nccl"; want_red="reduce over tcp"; across=tcp
else
  want_ch="data channels: 4 over cuda_ipc, 0 over shm, 0 over tcp, 2 over nccl"; want_red="reduce over nccl"; across=NCCL
fi
grep -q "$want_ch" "$W/two.log" && ok "$want_ch" || fail "transports: $(grep -o 'data channels.*' "$W/two.log")"
grep -q "replicas' $want_red" "$W/two.log" && ok "the image replicas' $want_red" \
  || fail "replicas' reduce: $(grep -o "replicas' reduce.*" "$W/two.log" | head -2 | tr '\n' ';')"
"$BIN" launch "$W/plan.yaml" --out "$W/single" --single-process --force >"$W/single.log" 2>&1 \
  || { fail "single process failed"; tail -5 "$W/single.log" | sed 's/^/    /'; }
out=$(same_ckpt "$W/two" "$W/single") && ok "two hosts over $across == single process: $out" \
  || fail "two hosts differ from the single process: $out"
left_behind "two hosts" "$W/two.log"
finish
