#!/usr/bin/env bash
# The docs against the code ("the README claims only what a test asserts";
# "a --help that is true"):
#  - every option a command's parser takes (the literals in cli/cmd_*.c) is in
#    that command's --help, and every option its usage lists is taken;
#  - bench/*.sh and scripts/* answer --help with their header comment (exit 0,
#    nothing else run) and list every option their parser takes;
#  - every option of a command line quoted in README.md's code blocks is in
#    that command's --help; every configs/*.yaml it names exists and loads;
#  - README "Plan keys": its keys are the keys plan.json holds, its literal
#    defaults are plan.json's values for a plan that sets only data.manifest,
#    each key takes its documented default through --set, and each numeric
#    key's documented range (each enum's values) is the schema's;
#  - README "metrics.jsonl schema": every field a pipeline run (zb-h1, a
#    scripted re-placement) and a --single-process run write is named there,
#    of the type common/metrics.h gives, and every field it lists is written
#    (restarts: tests/cli_restart.sh);
#  - README "Layout": every folder and file it names exists, every top-level
#    folder is named.
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
PY=${PYTHON:-python3}
command -v "$PY" >/dev/null || PY=/usr/bin/python3
command -v "$PY" >/dev/null || { echo "skip: no python3"; exit 77; }

# ---- mmpipe subcommands: parser literals vs --help ------------------------------
# opts FILE...: the option literals of the C code (not of the usage strings,
# whose lines start with a quote): "--name" and "-x" (not -h).
opts() {
  grep -hv '^[[:space:]]*"' "$@" | grep -oE '"--?[a-z][a-z-]*"' | tr -d '"' | grep -vxE -- '-h|--help' |
    sort -u
}
# in_help OPT TEXT: OPT appears in TEXT as an option (not inside a longer one).
in_help() { grep -qE -- "(^|[^-a-z])$1([^-a-z]|$)" <<<"$2"; }
# usage_opts TEXT: the options of the usage paragraph (up to the first blank
# line) and of the option list (lines "  --name ..." or "  -x, --name").
usage_opts() {
  { awk 'NF == 0 { exit } { print }' <<<"$1"; grep -E '^ {2}-' <<<"$1"; } |
    grep -oE -- '(^|[ [|])--?[a-z][a-z-]*' | sed 's/^[ [|]//' | grep -vxE -- '-h|--help' | sort -u
}
check_cmd() { # NAME "HELP ARGS" SOURCE...
  local name=$1 args=$2 help o bad=0 src=$W/src.c; shift 2
  cat "$@" >"$src"
  # shellcheck disable=SC2086
  help=$("$BIN" $args 2>&1) || { fail "$name --help exits 0"; return; }
  for o in $(opts "$src"); do
    in_help "$o" "$help" || { fail "$name: the parser takes $o, --help does not list it"; bad=1; }
  done
  for o in $(usage_opts "$help"); do
    opts "$src" | grep -qx -- "$o" || { fail "$name: --help lists $o, the parser does not take it"; bad=1; }
  done
  [ $bad = 1 ] || ok "$name: --help lists exactly the options its parser takes"
}
check_cmd launch "launch --help" cli/cmd_launch.c cli/args.c
check_cmd simulate "simulate --help" cli/cmd_simulate.c cli/args.c
check_cmd bench "bench --help" cli/cmd_bench.c
check_cmd "ckpt" "ckpt --help" cli/cmd_ckpt.c
check_cmd "data synth" "data synth --help" <(grep -A12 '^static int cmd_synth' cli/cmd_data.c)
check_cmd "data tokenize" "data tokenize --help" <(grep -A6 '^static int cmd_tokenize' cli/cmd_data.c)
check_cmd "data check" "data check --help" <(sed -n '/^static int cmd_check/,/^}/p' cli/cmd_data.c)
check_cmd stage "stage --help" cli/cmd_stage.c
check_cmd devices "devices --help" cli/cmd_devices.c
top=$("$BIN" --help)
for c in launch data simulate bench ckpt devices stage "ckpt verify" "ckpt diff" "ckpt export"; do
  grep -qE "^  $c " <<<"$top" || fail "mmpipe --help lists no '$c'"
done
"$BIN" --version | grep -qxE 'mmpipe [0-9]+\.[0-9]+\.[0-9]+' && ok "mmpipe --version: $("$BIN" --version)" \
  || fail "mmpipe --version: '$("$BIN" --version 2>&1)'"
for c in launch simulate bench; do
  bad=0
  # the command's lines, up to its description (indented 21 spaces)
  for o in $(awk -v c="  $c " 'index($0, c) == 1 { f = 1 } f && /^                     [a-z]/ { exit } f' <<<"$top" |
    grep -oE -- '--[a-z][a-z-]*' | sort -u); do
    in_help "$o" "$("$BIN" $c --help)" || { fail "mmpipe --help: $c $o is not in $c --help"; bad=1; }
  done
  # and the other way: every option of the command's synopsis is in its line
  for o in $(awk 'NF == 0 { exit } { print }' <<<"$("$BIN" $c --help)" |
    grep -oE -- '(^|[ [|])--?[a-z][a-z-]*' | sed 's/^[ [|]//' | sort -u); do
    awk -v c="  $c " 'index($0, c) == 1 { f = 1 } f && /^                     [a-z]/ { exit } f' <<<"$top" |
      grep -qE -- "(^|[^-a-z])$o([^-a-z]|$)" || { fail "mmpipe --help: $c's line lacks $o"; bad=1; }
  done
  [ $bad = 1 ] || ok "mmpipe --help: $c's options are $c's, and its line has every one"
done
expect_fail "data check: --max-pixels without --decode is refused" "applies with --decode" \
  "$BIN" data check /dev/null --max-pixels 5
expect_fail "mmpipe lanch: a near command is named" "^mmpipe: unknown command 'lanch' \(did you mean 'launch'\?\)$" \
  "$BIN" lanch x.yaml
expect_fail "mmpipe data chek: a near subcommand is named" "unknown command 'chek' \(did you mean 'check'\?\)$" \
  "$BIN" data chek x.jsonl
# a usage error: the message, the synopsis and where the rest is, not a whole
# --help that scrolls the message away (launch's is over 100 lines)
for c in launch simulate bench; do
  for a in "--steps" "--bogus" ""; do
    case $a in --steps) [ $c = simulate ] && a=--costs; want="^mmpipe $c: $a needs a value\$" ;;
      --bogus) want="^mmpipe $c: unknown option '--bogus'\$" ;; *) want="^mmpipe $c: no plan given\$" ;; esac
    args=(); [ -n "$a" ] && args=(x.yaml "$a")
    out=$("$BIN" $c "${args[@]}" 2>&1); rc=$?
    if [ $rc -eq 2 ] && head -1 <<<"$out" | grep -qE -- "$want" && [ "$(wc -l <<<"$out")" -le 8 ] &&
      tail -1 <<<"$out" | grep -qF "mmpipe $c --help"; then
      ok "$c ${args[*]}: a usage error in $(wc -l <<<"$out") lines: $(head -1 <<<"$out")"
    else fail "$c ${args[*]}: rc=$rc, $(wc -l <<<"$out") lines, first: $(head -1 <<<"$out")"; fi
  done
done
for args in "ckpt diff A" "ckpt export X" "data synth --samples 3" "data check A B"; do
  out=$("$BIN" $args 2>&1); rc=$?
  c=$(cut -d' ' -f1-2 <<<"$args")
  if [ $rc -eq 2 ] && head -1 <<<"$out" | grep -q "^mmpipe $c: " && [ "$(wc -l <<<"$out")" -le 6 ] &&
    tail -1 <<<"$out" | grep -qF "mmpipe $c --help"; then
    ok "$args: a usage error in $(wc -l <<<"$out") lines: $(head -1 <<<"$out")"
  else fail "$args: rc=$rc, $(wc -l <<<"$out") lines, first: $(head -1 <<<"$out")"; fi
done

# ---- bench/*.sh and scripts/*: --help ----------------------------------------------
for s in bench/*.sh scripts/*; do
  [ "$s" = bench/lib.sh ] || [ ! -x "$s" ] && continue
  head -1 "$s" | grep -q bash || continue
  out=$(timeout 10 "$s" --help 2>&1); rc=$?
  want=$(sed -n 2p "$s" | sed 's/^# \{0,1\}//')
  if [ $rc -ne 0 ] || [ "$(head -1 <<<"$out")" != "$want" ] || grep -q '^set -' <<<"$out"; then
    fail "$s --help: rc=$rc, not its header comment"; continue
  fi
  bad=0
  spec=$(awk '/bench_args bench/ { f = 1 } f { print } f && !/\\$/ { exit }' "$s" | grep -oE -- '--[a-z-]+=' |
    tr -d '=')
  [ "$s" = bench/learning.sh ] && spec=$(grep -oE '^ +--[a-z-]+\)' "$s" | tr -d ' )')
  for o in $spec; do in_help "$o" "$out" || { fail "$s: takes $o, --help does not list it"; bad=1; }; done
  [ $bad = 1 ] || ok "$s --help: its header, every option"
done

# ---- command lines quoted in README.md (code blocks and `inline`) -----------------
CMD='([A-Z_]+=[^ `]+ )*(bash )?((build/)?mmpipe|bench/[a-z_0-9]+\.sh|scripts/[a-z-]+|build/bench/[a-z_]+)( |$)'
bad=0
while IFS= read -r line; do
  cmd=$(sed -E 's/^([A-Z_]+=[^ ]+ )*//; s/^bash //; s#^build/mmpipe#mmpipe#' <<<"$line" | sed 's/ #.*//')
  set -f; read -ra w <<<"$cmd"; set +f
  case ${w[0]} in
    mmpipe) [ ${#w[@]} -gt 1 ] || continue
            args=("${w[1]}"); [[ ${w[1]} =~ ^(data|ckpt)$ && ${w[2]:-} =~ ^[a-z]+$ ]] && args+=("${w[2]}")
            help=$("$BIN" "${args[@]}" --help 2>&1) || { fail "README: '${args[*]}' has no --help: $line"; bad=1; continue; } ;;
    bench/*.sh | scripts/*) [ -x "${w[0]}" ] || { fail "README: no ${w[0]}: $line"; bad=1; continue; }
            help=$(timeout 10 "${w[0]}" --help 2>&1) ;;
    build/bench/*) exe=$(dirname "$BIN")/bench/${w[0]#build/bench/}
            [ -x "$exe" ] || continue # not built here
            help=$("$exe" --help 2>&1) ;;
    *) continue ;;
  esac
  for o in $(grep -oE -- '(^| |\[)--[a-z][a-z-]*' <<<"$cmd" | sed 's/^[ [|]//'); do
    in_help "$o" "$help" || { fail "README: $o is not in ${w[0]} --help: $line"; bad=1; }
  done
done < <({ awk '/^```/ { f = !f; next } f' README.md; grep -oE '`[^`]+`' README.md | tr -d '`'; } |
  sed 's/\\|/|/g' | grep -E "^$CMD")
[ $bad = 1 ] || ok "README: every option of its quoted command lines is in that command's --help"

# every plan README.md names exists and loads (simulate: no data needed)
bad=0; n=0
for f in $(grep -oE 'configs/[A-Za-z0-9_.-]+\.yaml' README.md | sort -u); do
  n=$((n + 1))
  "$BIN" simulate "$f" >/dev/null 2>"$W/cfg.err" || { fail "README names $f: $(head -1 "$W/cfg.err")"; bad=1; }
done
[ $bad = 1 ] || ok "README: the $n plans it names exist and load"

# checked FILE MESSAGE: a checker's output (FAIL lines, then an OK line) into
# the tally: each FAIL a failed check, else MESSAGE as one passed check (a
# checker that ended without its OK line fails).
checked() {
  local n; n=$(grep -c '^FAIL' "$1")
  grep '^FAIL' "$1"
  fails=$((fails + n)); checks=$((checks + n))
  if [ "$n" -eq 0 ]; then
    grep -q '^OK' "$1" && ok "$2" || fail "$2: the checker stopped early ($(tail -1 "$1"))"
  fi
}

# ---- README "Plan keys" against plan.json -----------------------------------------
synth 200 1
mkdir -p "$W/min"
printf 'data: { manifest: %s/data/train.jsonl }\n' "$W" >"$W/min/plan.yaml"
"$BIN" launch "$W/min/plan.yaml" --steps 0 --out "$W/min/run" >"$W/min.log" 2>&1 ||
  { fail "a 0-step run of the minimal plan"; cat "$W/min.log"; finish; }
"$PY" - "$W/min/run/plan.json" README.md >"$W/keys.out" <<'PY'
import json, re, sys
plan = json.load(open(sys.argv[1]))
def leaves(o, pre=""):
    for k, v in o.items():
        p = pre + k
        if isinstance(v, dict):
            yield from leaves(v, p + ".")
        else:
            yield p, v
got = dict(leaves(plan))
sec = open(sys.argv[2]).read().split("\n### Plan keys\n", 1)
if len(sec) < 2:
    print("FAIL README has no '### Plan keys' section"); sys.exit()
rows = [l for l in sec[1].split("\n## ", 1)[0].splitlines() if l.startswith("| `")]
doc = {}
for r in rows:
    cells = [c.strip() for c in r.strip("|").split(" | ")]
    doc[cells[0].strip("`")] = cells[2]
for k in sorted(set(got) - set(doc)):
    print(f"FAIL plan.json has {k}, README Plan keys does not")
for k in sorted(set(doc) - set(got)):
    print(f"FAIL README Plan keys lists {k}, plan.json has no such key")
for k, d in doc.items():
    m = re.fullmatch(r"`([^`]*)`", d)
    if not m or k not in got or k == "job.steps":  # job.steps: the run above sets 0
        continue
    v = got[k]
    text = json.dumps(v, separators=(",", ":"))
    if m.group(1) not in (text, v if isinstance(v, str) else None):
        print(f"FAIL README Plan keys: {k} default {m.group(1)}, plan.json writes {text}")
    else:
        print(f"SET {k}={m.group(1)}")
print(f"OK {len(doc)} keys")
PY
checked "$W/keys.out" \
  "README Plan keys: $(grep '^OK' "$W/keys.out" | cut -d' ' -f2) keys = plan.json's, literal defaults = its values"
bad=0
while IFS= read -r kv; do
  "$BIN" simulate "$W/min/plan.yaml" --set "$kv" >/dev/null 2>"$W/set.err" ||
    { fail "--set $kv (README's default) is refused: $(head -1 "$W/set.err")"; bad=1; }
done < <(sed -n 's/^SET //p' "$W/keys.out")
[ $bad = 1 ] || ok "every documented default is taken by --set"

# README "Plan keys" ranges against the schema's: each numeric key's values
# cell names the range the key's out-of-range error gives ("a .. b", "[a, b)",
# "≥ a" for an upper bound of 10^9 or more); an enum's cell lists exactly the
# values its error accepts.
"$PY" - "$BIN" "$W/min/plan.yaml" README.md >"$W/ranges.out" <<'PY'
import re, subprocess, sys
binp, plan, readme = sys.argv[1:4]
# the schema's range of a key is in its error for a value below any range
sec = open(readme).read().split("\n### Plan keys\n", 1)[1].split("\n## ", 1)[0]
rows = [l for l in sec.splitlines() if l.startswith("| `")]
NUM = r"-?[0-9][0-9.e+]*"
def num(t):
    t = t.replace("10^9", "1000000000").replace("10^6", "1000000").replace("2^20", "1048576")
    t = t.replace("16384²", "268435456")
    return float(t)
def doc_range(cell):
    c = cell.replace("`", "")
    for a, b in (("10^9", "1000000000"), ("10^6", "1000000"), ("2^20", "1048576"), ("16384²", "268435456")):
        c = c.replace(a, b)
    m = re.search(r"([\[(])\s*(%s),\s*(%s)\s*([\])])" % (NUM, NUM), c)
    if m:
        return m.group(1), float(m.group(2)), float(m.group(3)), m.group(4)
    m = re.search(r"(%s) \.\. (?:min\([^,]*, *)?(%s)" % (NUM, NUM), c)
    if m:
        return "[", float(m.group(1)), float(m.group(2)), "]"
    m = re.search(r"(≥|>) *(%s)" % NUM, c)
    if m:
        return "[" if m.group(1) == "≥" else "(", float(m.group(2)), float("inf"), ")"
    return None
bad = 0
n = 0
for r in rows:
    cells = [x.strip() for x in r.strip("|").split(" | ")]
    key, values = cells[0].strip("`"), cells[1]
    if values.startswith("as "):
        continue
    tries = ["-3000000000", "[-3000000000]", "[-3e9,-3e9,-3e9]"]
    code = None
    for v in tries:
        p = subprocess.run([binp, "simulate", plan, "--set", f"{key}={v}"], capture_output=True, text=True)
        m = re.search(r"is out of range ([\[(])(%s), (%s)([\])])" % (NUM, NUM), p.stderr)
        if m:
            code = m.group(1), float(m.group(2)), float(m.group(3)), m.group(4)
            break
        m = re.search(r"unknown value '[^']*' \(accepted: ([^)]*)\)", p.stderr)
        if m:  # an enum: the cell's `words` are its values
            n += 1
            if set(m.group(1).split(", ")) != set(re.findall(r"`([^`]*)`", values)):
                print(f"FAIL README Plan keys: {key}: '{values}', the schema accepts {m.group(1)}")
            break
        if not re.search(r"list|values", p.stderr):  # not a list key: no range to find
            break
    if not code:
        continue
    n += 1
    doc = doc_range(values)
    if not doc:
        print(f"FAIL README Plan keys: {key}: no range in '{values}', the schema's is {code[0]}{code[1]:g}, {code[2]:g}{code[3]}")
        continue
    lo_ok = doc[0] == code[0] and doc[1] == code[1]
    hi_ok = (doc[2] == float("inf") and code[2] >= 1e9) or (doc[2] == code[2] and doc[3] == code[3])
    if not (lo_ok and hi_ok):
        print(f"FAIL README Plan keys: {key}: '{values}', the schema's range is {code[0]}{code[1]:g}, {code[2]:g}{code[3]}")
print(f"OK {n} ranges")
PY
checked "$W/ranges.out" "README Plan keys: $(grep '^OK' "$W/ranges.out" | cut -d' ' -f2) ranges and value lists = the schema's"

# ---- README "metrics.jsonl schema" against real runs ------------------------------
balance_plan "$W/bal.yaml" 4 0 'step: 2, set: "stages.image.replicas=[1, 1]"'
"$BIN" launch "$W/bal.yaml" --set train.schedule=zb-h1 --set train.final_eval=true \
  --out "$W/pipe" >"$W/pipe.log" 2>&1 || { fail "pipeline run"; tail -5 "$W/pipe.log"; }
"$BIN" launch "$W/bal.yaml" --single-process --set train.final_eval=true --set job.steps=2 \
  --out "$W/single" >"$W/single.log" 2>&1 || { fail "single-process run"; tail -5 "$W/single.log"; }
left_behind "pipeline run" "$W/pipe.log"
"$PY" - "$W/pipe/metrics.jsonl" "$W/single/metrics.jsonl" README.md >"$W/metrics.out" <<'PY'
import json, re, sys
seen = set()
def walk(o, where):
    for k, v in o.items():
        seen.add((where, k))
        if k == "stages":
            for s in v:
                walk(s, "stages")
        elif isinstance(v, dict):
            walk(v, k)
# the types common/metrics.h gives (the schema's reference, field by field)
INTS = {"step", "skipped_samples", "step_skipped", "chained", "replica", "microbatches",
        "max_inflight", "peak_mem_bytes"}
STRS = {"name", "placement"}
def types(o, where):
    for k, v in o.items():
        want = int if k in INTS else str if k in STRS else None
        if k == "stages":
            for st in v:
                types(st, "stages")
        elif k == "balance":
            types({kk: vv for kk, vv in v.items() if kk != "decision"}, "balance")
            if v["decision"] is not None and not isinstance(v["decision"], dict):
                print(f"FAIL balance.decision is neither null nor an object: {v['decision']!r}")
        elif want and not (isinstance(v, want) and not isinstance(v, bool)):
            print(f"FAIL {where}.{k} = {v!r}, metrics.h says {want.__name__}")
        elif not want and not isinstance(v, (int, float)) and not (k == "grad_norm" and v is None):
            print(f"FAIL {where}.{k} = {v!r}, metrics.h says number")
for path in sys.argv[1:3]:
    for line in open(path):
        rec = json.loads(line)
        walk(rec, "step")
        types(rec, "step")
sec = open(sys.argv[3]).read().split("\n### metrics.jsonl schema\n", 1)[1].split("\n### ", 1)[0]
words = set(re.findall(r"[a-z_0-9]+", sec))
for where, k in sorted(seen):
    if k not in words:
        print(f"FAIL metrics.jsonl writes {where}.{k}, README's schema does not name it")
# the field lists: every backticked text with a comma, quoted values dropped
named = set()
for seg in re.findall(r"`([^`]*)`", sec, re.S):
    if "," in seg:
        named |= set(re.findall(r"[a-z_][a-z_0-9]*", re.sub(r'"[^"]*"', "", seg)))
keys = {k for _, k in seen}
for k in sorted(named - keys - {"restarts", "n", "after_step", "from_step", "cause", "single"}):
    print(f"FAIL README's schema names {k}, no run wrote it")
for k in ("action", "to", "predicted_gain", "reason"):
    if ("decision", k) not in seen:
        print(f"FAIL the scripted re-placement wrote no decision.{k}")
print(f"OK {len(seen)} fields")
PY
checked "$W/metrics.out" \
  "README metrics.jsonl schema: every field written is named, every named field written"

# ---- README "Layout" --------------------------------------------------------------
"$PY" - README.md >"$W/layout.out" <<'PY'
import os, re, subprocess, sys
block = open(sys.argv[1]).read().split("\n## Layout\n", 1)[1].split("```")[1]
rows, cur = {}, None
for line in block.splitlines():
    m = re.match(r"^(\S+)\s+(.*)$", line)
    if m:
        cur = m.group(1)
        rows[cur] = [m.group(2)]
    elif cur:
        rows[cur].append(line.strip())
files = subprocess.run(["git", "ls-files"], capture_output=True, text=True).stdout.split()
for head, lines in rows.items():
    if not os.path.exists(head):
        print(f"FAIL Layout names {head}, which does not exist")
    folder = head if head.endswith("/") else ""
    for tok in re.findall(r"[A-Za-z0-9_./+-]+\.(?:\{[a-z,]+\}|[a-z]+)\b", " ".join(lines)):
        m = re.match(r"(.*)\.\{([a-z,]+)\}$", tok)
        for name in [m.group(1) + "." + e for e in m.group(2).split(",")] if m else [tok]:
            if not re.search(r"\.(c|h|cu|sh|py|proto|png)$", name):
                continue
            if not (os.path.exists(folder + name) or os.path.exists(name) or
                    any(f.startswith(folder) and f.endswith("/" + name) for f in files)):
                print(f"FAIL Layout: {head} names {name}, which does not exist")
tops = {f.split("/")[0] + "/" for f in files if "/" in f and not f.startswith(".")}
for t in sorted(tops - set(rows)):
    print(f"FAIL Layout has no row for the top-level folder {t}")
print(f"OK {len(rows)} rows")
PY
checked "$W/layout.out" "README Layout: every name exists, every top-level folder has its row"
finish
