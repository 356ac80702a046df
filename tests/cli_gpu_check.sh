#!/usr/bin/env bash
# scripts/gpu-check's own logic on a machine without a GPU (a dry run): the
# device session is rare and short, so the script that spends it must work
# the first time. On this build (MMP_GPU_CHECK_BUILD_DIR, the build step
# skipped), twice:
#  - with a 100 s deadline: it says "no GPU", runs the device steps it can
#    (they fail or skip by name: the NCCL tests' skip is a failure; the
#    transport suite's cuda_ipc cases alone), counts a step none of whose parts ran
#    (profile: no bench data) as no pass, names the steps MMP_GPU_CHECK_SKIP
#    left out, ends with the FAILED verdict, exits 1, and brings back
#    report.txt and a readable logs.tar.gz holding the steps' logs and the
#    run logs a failed whole-run test left;
#  - with a 5 s deadline: the steps that cannot fit are skipped and named
#    with the time they need;
#  - with a configure that fails: exit 1, the report still ends with a
#    verdict line, cmake.log comes back;
#  - neither leaves its logs folder (/tmp/mmpipe-gpu-logs.*) behind.
# Skips (77) on a machine whose nvidia-smi lists a GPU (scripts/gpu-check is
# the real thing there).
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
if nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "a GPU is visible: scripts/gpu-check runs for real here; skipped"
  exit 77
fi
workdir
# the build's binaries and test list, seen from a folder of the test's own:
# the ctest that gpu-check runs writes its Testing/ logs there, not into the
# build tree of the ctest running this test
R0=$(cd "$(dirname "$BIN")" && pwd)
B=$W/build
mkdir -p "$B"
cp "$R0/CTestTestfile.cmake" "$B/" 2>/dev/null
for f in mmpipe tests bench; do ln -s "$R0/$f" "$B/$f"; done
logs_before=$(ls -d /tmp/mmpipe-gpu-logs.* 2>/dev/null | sort)
check() { # NAME DEADLINE SKIP: runs gpu-check into $W/NAME, its exit status in rc
  OUT=$W/$1 MMP_GPU_CHECK_BUILD_DIR=$B MMP_GPU_CHECK_DEADLINE_S=$2 MMP_GPU_CHECK_SKIP=$3 \
    MMP_GPU_CHECK_DEVICE_ENV=0 MMP_GPU_CHECK_MEMCHECK=1 timeout 200 bash scripts/gpu-check \
    >"$W/$1.log" 2>&1
  rc=$?
}
# a failed whole-run test keeps its folder of run logs: they travel back
mkdir -p "$B/testtmp/gpu_two_hosts" && echo "a run's log" >"$B/testtmp/gpu_two_hosts/two.log"
check dry 100 "build tests again bench memcheck"
R=$W/dry/report.txt
[ "$rc" -eq 1 ] && ok "dry run: exit 1" || fail "dry run: exit $rc"
[ -s "$R" ] && ok "report.txt came back" || fail "no report.txt in \$OUT"
grep -q '^no GPU: nvidia-smi lists none here' "$R" && ok "it says there is no GPU" \
  || fail "no 'no GPU' line: $(head -5 "$R" | tr '\n' ';')"
grep -q '^gpu-check: FAILED: no GPU here' "$R" && ok "the verdict names the missing GPU" \
  || fail "verdict: $(tail -1 "$R")"
miss=""
for s in build tests again bench memcheck; do
  grep -q "^  skipped: $s (MMP_GPU_CHECK_SKIP)" "$R" || miss="$miss $s"
done
[ -z "$miss" ] && ok "every step in MMP_GPU_CHECK_SKIP named as skipped" \
  || fail "steps not named as skipped by MMP_GPU_CHECK_SKIP:$miss"
grep -q '^  failed: nccl: an nccl test skipped on the GPU machine' "$R" && ok "the NCCL tests ran and their skip is a failure" \
  || fail "nccl: $(grep -i nccl "$R" | tail -3 | tr '\n' ';')"
# the transport step runs the suite's cuda_ipc cases alone (in a CUDA build;
# a CPU build's suite has none, and the step says so)
if grep -q 'test_transport lists no cuda_ipc case' "$R"; then
  ok "transport: this build has no cuda_ipc case, named"
else
  mkdir -p "$W/logs" && tar -C "$W/logs" -xzf "$W/dry/logs.tar.gz" 2>/dev/null
  T=$W/logs/test_transport-memops.log
  grep -q '^-- cuda_ipc/ordered$' "$T" && ! grep -q '^-- \(shm\|tcp\)/' "$T" \
    && ok "transport: the cuda_ipc cases alone" || fail "transport ran: $(grep '^-- ' "$T" | head -3 | tr '\n' ' ')"
fi
if [ -e /tmp/mmpipe-bench-gpu/data32/train.jsonl ] || [ -e /tmp/mmpipe-bench-gpu/data224/train.jsonl ]; then
  ok "profile: bench data from an earlier run is here; its pass is not judged"
else
  grep -q '^  skipped: profile demo (bench/gpu.sh.s data missing)' "$R" && ok "profile demo skipped (no bench data)" \
    || fail "profile demo not skipped: $(grep -i profile "$R" | tr '\n' ';')"
  passed=$(grep '^gpu-check: [0-9]*s; steps passed:' "$R")
  [ -n "$passed" ] && ! grep -qw profile <<<"$passed" && ok "a step none of whose parts ran is no pass: $passed" \
    || fail "profile counted as passed (or no summary): '$passed'"
fi
if tar -tzf "$W/dry/logs.tar.gz" >"$W/list" 2>&1; then
  grep -q 'ctest-nccl.log' "$W/list" && ok "logs.tar.gz holds the steps' logs" \
    || fail "logs.tar.gz lacks ctest-nccl.log: $(tr '\n' ' ' <"$W/list")"
  grep -q 'gpu_two_hosts/two.log' "$W/list" && ok "logs.tar.gz holds a failed whole-run test's run logs" \
    || fail "logs.tar.gz lacks gpu_two_hosts/two.log: $(tr '\n' ' ' <"$W/list")"
else
  fail "logs.tar.gz missing or unreadable"
fi

check short 5 "build"
R=$W/short/report.txt
[ "$rc" -eq 1 ] && ok "short deadline: exit 1" || fail "short deadline: exit $rc"
miss=""
for s in tests:120 nccl:60 transport:60 memcheck:60; do
  grep -qE "^skipped: ${s%%:*} \(needs ~${s##*:} s, -?[0-9]+ s left of the 5 s deadline\)" "$R" \
    || miss="$miss ${s%%:*}"
done
[ -z "$miss" ] && ok "steps that cannot fit in the deadline are skipped with the time they need" \
  || fail "not skipped for time:$miss"
grep -q '^gpu-check: FAILED' "$R" && ok "short deadline: a verdict line" || fail "short deadline: no verdict"

# a configure that fails (no such generator): the report still ends with a verdict
OUT=$W/nocmake MMP_GPU_CHECK_BUILD_DIR=$W/bgpu MMP_GPU_CMAKE_FLAGS="-G NoSuchGenerator" \
  MMP_GPU_CHECK_DEVICE_ENV=0 timeout 120 bash scripts/gpu-check >"$W/nocmake.log" 2>&1
rc=$?
last=$(tail -1 "$W/nocmake/report.txt" 2>/dev/null)
[ "$rc" -eq 1 ] && [ "$last" = "gpu-check: FAILED: cmake (nothing built or run)" ] \
  && ok "a failed configure: exit 1, the report's last line is the verdict" \
  || fail "a failed configure: exit $rc, last line '$last'"
tar -tzf "$W/nocmake/logs.tar.gz" 2>/dev/null | grep -q cmake.log && ok "a failed configure: cmake.log comes back" \
  || fail "a failed configure: no cmake.log in logs.tar.gz"

logs_after=$(ls -d /tmp/mmpipe-gpu-logs.* 2>/dev/null | sort)
[ "$logs_after" = "$logs_before" ] && ok "no logs folder left in /tmp" \
  || fail "left in /tmp: $(comm -13 <(echo "$logs_before") <(echo "$logs_after") | tr '\n' ' ')"
finish
