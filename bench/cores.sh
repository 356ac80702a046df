#!/usr/bin/env bash
# The demo pipeline on the cores there are vs the single process (issue 17);
# one run, medians; judges nothing. configs/demo.yaml with `stages: auto`
# (profile one process per stage, then the planner's placement for this
# host's cores, processes sharing cores: coordinator/planner_cores.h) and
# train.pin (--pin, default auto: process k on core k % cores), against
# `--single-process` at train.threads 1 (same pinning: its first core) and,
# for honesty, at train.threads 2; the same data (2000 synthetic samples),
# STEPS steps, evaluation off. Runs alternate (single t1, pipeline, single
# t2) for ROUNDS rounds; each run's figure is the median over its steps
# FROM..STEPS (after the re-placement and a warm-up), then the median over
# rounds; with 2 or more cores each round also runs two single processes at
# once, one pinned to each of two cores (their summed samples/s: what 2
# cores give independent work here, the ceiling of any split of it).
# Prints a Markdown table: samples/s, the pipeline / single ratio,
# balance efficiency (measured, metrics.jsonl; and the ratio / cores: the
# single process's compute spread over the cores, the bar's 0.9), the
# bubble, CPU time per step of all processes (single vs pipeline: the most
# the pipeline could reach with no bubble; whole runs, and per process over
# the measured steps from metrics.jsonl's cpu_ms), the planner's prediction, and
# where the pipeline's step goes:
# per process, median ms per step of compute (F, B, L, OPT) and of waiting
# in the replicas' reduce and gather (trace.json, last round).
# The pipeline routes round robin by default (--routing): the CPU planner
# packs cores for micro-batches dealt equally; weighted routing (the plan
# default) now leaves that deal alone where processes share cores
# (coordinator/balancer.h), so --routing weighted runs the same.
#   bench/cores.sh [--bin build/mmpipe] [--out runs/bench-cores] [--rounds 2]
#                  [--steps 150] [--from 31] [--pin auto] [--routing round_robin]
#                  [--set KEY=VALUE]...
set -uo pipefail
. "$(dirname "$0")/lib.sh" || exit 1
bench_args bench/cores.sh --bin=BIN=build/mmpipe --out=OUT=runs/bench-cores --rounds=ROUNDS=2 \
  --steps=STEPS=150 --from=FROM=31 --pin=PIN=auto --routing=ROUTING=round_robin --set=+sets -- "$@"
bench_need_bin
. tests/lib.sh # median, metric
bench_fresh_out
"$BIN" data synth --out "$OUT/data" --samples 2000 --seed 4 >/dev/null 2>&1 || { say "synth failed"; exit 1; }
cores=$(nproc)
common=(--set "data.manifest=$OUT/data/train.jsonl" --set "job.steps=$STEPS" --set train.eval_every=0
        --set train.final_eval=false --set "train.pin=$PIN" "${sets[@]}")
run() { # NAME ARGS...: a run into $OUT/NAME, its CPU time (user + system, all processes) in NAME.cpu
  local name=$1; shift
  say "$name ..."
  /usr/bin/time -o "$OUT/$name.cpu" -f "%U %S" \
    "$BIN" launch configs/demo.yaml "${common[@]}" "$@" --out "$OUT/$name" >"$OUT/$name.log" 2>&1 \
    || { say "$name failed (see $OUT/$name.log)"; exit 1; }
}
# CPU ms per step of a run: its whole CPU time (start-up, profiling and
# relaunch included) over its steps.
cpu() { tail -1 "$OUT/$1.cpu" | awk -v n="$STEPS" '{ printf "%.1f", ($1 + $2) * 1000 / n }'; }
sps() { metric "$OUT/$1/metrics.jsonl" samples_per_s "$FROM" "$STEPS" | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
# The first two cores this process may use (Cpus_allowed_list), for the pair below.
two=$(/usr/bin/python3 -c '
import os; c = sorted(os.sched_getaffinity(0)); print(*c[:2]) if len(c) > 1 else None')
# Two single processes at once, one pinned to each of two cores: the most any
# split of the work over 2 cores can give on this machine (the two cores
# share caches, memory bandwidth and, on a VM, perhaps a physical core).
pair() { # NAME: both runs into $OUT/NAME.a and $OUT/NAME.b
  local name=$1 ca cb
  read -r ca cb <<<"$two"
  say "$name ..."
  "$BIN" launch configs/demo.yaml "${common[@]}" --single-process --set train.threads=1 \
    --set "train.pin=[$ca]" --out "$OUT/$name.a" >"$OUT/$name.a.log" 2>&1 &
  local a=$!
  "$BIN" launch configs/demo.yaml "${common[@]}" --single-process --set train.threads=1 \
    --set "train.pin=[$cb]" --out "$OUT/$name.b" >"$OUT/$name.b.log" 2>&1 \
    || { say "$name.b failed (see $OUT/$name.b.log)"; wait $a; exit 1; }
  wait $a || { say "$name.a failed (see $OUT/$name.a.log)"; exit 1; }
}
s1=() s2=() pp=() eff=() bub=() c1=() cp=() pr=()
for r in $(seq 1 "$ROUNDS"); do
  run "single-t1-$r" --single-process --set train.threads=1
  run "pipeline-$r" --set stages=auto --set train.threads=1 --set "balance.routing=$ROUTING"
  run "single-t2-$r" --single-process --set train.threads=2
  if [ -n "$two" ]; then
    pair "pair-$r"
    pr+=("$(awk -v a="$(sps "pair-$r.a")" -v b="$(sps "pair-$r.b")" 'BEGIN { print a + b }')")
  fi
  s1+=("$(sps "single-t1-$r")") s2+=("$(sps "single-t2-$r")") pp+=("$(sps "pipeline-$r")")
  eff+=("$(metric "$OUT/pipeline-$r/metrics.jsonl" efficiency "$FROM" "$STEPS" | median)")
  bub+=("$(metric "$OUT/pipeline-$r/metrics.jsonl" bubble "$FROM" "$STEPS" | median)")
  c1+=("$(cpu "single-t1-$r")") cp+=("$(cpu "pipeline-$r")")
done
med() { printf '%s\n' "$@" | median; }
S1=$(med "${s1[@]}") S2=$(med "${s2[@]}") P=$(med "${pp[@]}")
last="$OUT/pipeline-$ROUNDS"
placement=$(tail -1 "$last/metrics.jsonl" | grep -o '"placement":"[^"]*"' | sed 's/.*:"//; s/"$//')
why=$(grep -o '"reason":"stages: auto[^"]*"' "$last/metrics.jsonl" | head -1 | sed 's/"reason":"//; s/"$//')
echo "demo, $cores cores, train.pin $PIN, balance.routing $ROUTING, $STEPS steps, medians of steps $FROM-$STEPS over $ROUNDS rounds (alternating)"
echo
echo "| run | samples/s | vs single t1 |"
echo "|---|---|---|"
echo "| \`--single-process\`, train.threads 1 | $S1 (${s1[*]}) | 1.00x |"
echo "| \`--single-process\`, train.threads 2 | $S2 (${s2[*]}) | $(ratio "$S2" "$S1")x |"
echo "| pipeline, \`stages: auto\` -> $placement, train.threads 1 | $P (${pp[*]}) | $(ratio "$P" "$S1")x |"
if [ ${#pr[@]} -gt 0 ]; then
  PR=$(med "${pr[@]}")
  echo "| two \`--single-process\` t1 at once, pinned to cores $two (the sum) | $PR (${pr[*]}) | $(ratio "$PR" "$S1")x |"
fi
echo
echo "balance efficiency: measured $(med "${eff[@]}") (${eff[*]}; busy is wall time in compute, so"
echo "processes sharing a core count their wait for it); ratio / cores $(awk -v a="$P" -v b="$S1" -v c="$cores" 'BEGIN { printf "%.2f", a / b / c }');"
echo "bubble $(med "${bub[@]}") (${bub[*]})"
[ ${#pr[@]} -gt 0 ] && echo "pipeline / two singles at once (the 2-core ceiling here): $(ratio "$P" "$PR")x"
C1=$(med "${c1[@]}") CP=$(med "${cp[@]}")
echo "CPU per step (all processes, start-up, profiling and relaunch included): single t1 $C1 ms,"
echo "pipeline $CP ms ($(ratio "$CP" "$C1")x)"
echo "planner: ${why:-no re-placement}"
echo
echo "CPU ms per step of each process (metrics.jsonl cpu_ms: getrusage, user + system, every"
echo "thread, from one step's record to the next; medians over steps $FROM-$STEPS, per round, then"
echo "over rounds; load inflates CPU time much less than wall time):"
/usr/bin/python3 - "$OUT" "$ROUNDS" "$FROM" "$STEPS" "$cores" <<'PY'
import collections, json, statistics, sys
out, rounds, lo, hi, cores = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
med = statistics.median
def per_proc(run):
    """{process: median cpu_ms}, "coordinator" and "all" included, over steps lo..hi"""
    rows = collections.defaultdict(list)
    for line in open("%s/%s/metrics.jsonl" % (out, run)):
        r = json.loads(line)
        if not lo <= r["step"] <= hi or "cpu_ms" not in r:
            continue
        own = 0.0
        for s in r["stages"]:
            if "cpu_ms" in s:
                rows["%s/%d" % (s["name"], s.get("replica", 0))].append(s["cpu_ms"])
                own += s["cpu_ms"]
        if len(r["stages"]) > 1:
            rows["coordinator"].append(r["cpu_ms"] - own)
        rows["all"].append(r["cpu_ms"])
    return {k: med(v) for k, v in rows.items()}
single = [per_proc("single-t1-%d" % k) for k in range(1, rounds + 1)]
pipe = [per_proc("pipeline-%d" % k) for k in range(1, rounds + 1)]
if not all("all" in x for x in single + pipe):
    print("(no cpu_ms in metrics.jsonl: a binary older than this script)")
    sys.exit(0)
procs = sorted({k for x in pipe for k in x if k != "all"}, key=lambda k: (k == "coordinator", k))
print("| process | CPU ms per step (per round) |")
print("|---|---|")
def row(name, xs, key):
    v = [x.get(key) for x in xs if key in x]
    print("| %s | %.1f (%s) |" % (name, med(v), " ".join("%.1f" % a for a in v)))
row("`--single-process` t1", single, "all")
for k in procs:
    row("pipeline " + k, pipe, k)
row("pipeline, all processes", pipe, "all")
s1, sp = med(x["all"] for x in single), med(x["all"] for x in pipe)
print("\npipeline / single CPU per step: %.3fx; with no bubble at all the pipeline could reach"
      " %.2fx on %d cores" % (sp / s1, cores * s1 / sp, cores))
PY
echo
echo "where the pipeline's step goes (ms per step, medians over steps $FROM-$STEPS, $last/trace.json):"
/usr/bin/python3 - "$last/trace.json" "$FROM" "$STEPS" <<'PY'
import collections, json, statistics, sys
t = json.load(open(sys.argv[1]))
ev = t["traceEvents"] if isinstance(t, dict) else t
lo, hi = int(sys.argv[2]), int(sys.argv[3])
names = {e["pid"]: e["args"]["name"] for e in ev if e.get("name") == "process_name"}
per = collections.defaultdict(lambda: collections.defaultdict(float))
span = {}
for e in ev:
    s = e.get("args", {}).get("step") if e.get("ph") == "X" else None
    if s is None or not lo <= s <= hi:
        continue
    per[names.get(e["pid"], str(e["pid"]))][(e["name"], s)] += e["dur"] / 1000
    a, b = span.get(s, (e["ts"], e["ts"] + e["dur"]))
    span[s] = (min(a, e["ts"]), max(b, e["ts"] + e["dur"]))
kinds = sorted({k for p in per.values() for k, _ in p})
print("| process | " + " | ".join(kinds) + " |")
print("|---" * (len(kinds) + 1) + "|")
for p in sorted(per):
    row = []
    for k in kinds:
        v = [d for (kk, s), d in per[p].items() if kk == k]
        row.append("%.2f" % statistics.median(v) if v else "")
    print("| %s | %s |" % (p, " | ".join(row)))
if span:
    print("\nstep span in the trace: %.1f ms" % statistics.median((b - a) / 1000 for a, b in span.values()))
PY
