#!/usr/bin/env bash
# The run directory and what launch does before it trains (issue 11):
#  lock:        --force or --resume into a live run is refused naming the
#               holder's pid, and changes nothing; a dead holder does not block;
#  failed start: a run whose stage died before step 1 (no step, no
#               checkpoint) is replaced by the next launch without --force,
#               which says so; a run with steps or a checkpoint still needs it;
#  no shell:    --force on paths with quotes, spaces, an apostrophe and a
#               newline replaces that run's outputs and nothing else
#               (--out "runs/victim' 'x" leaves runs/victim alone);
#  fingerprint: --resume under a plan that changes the model or the data
#               order (same shapes), or whose job.steps its checkpoint is
#               past, is refused naming the key, nothing changes on disk;
#               keys a resume may change are accepted;
#  preflight:   a missing manifest, vocab or named validation set, or an
#               empty manifest, is one error naming its key, before any
#               process or file exists; no
#               validation set is needed with evaluation off, and without
#               val.jsonl beside the manifest evaluation is off (said once);
#               evaluation obeys data.on_bad_sample: skip;
#  paths:       relative plan paths resolve beside the plan file (launching
#               from / works), --set ones against the current directory;
#               plan.json records them absolute; a relative --out holds the
#               whole run when stages start in another hosts[].workdir;
#  vocab:       English captions under the synthetic 64-token vocab make
#               launch warn about [UNK] (naming scripts/vocab); the real
#               bert-base-uncased vocab does not;
#  token:       no stage process has the job token in its argv or environ;
#               stage processes are named mmpipe (not exe);
#  batch:       a train.batch above the manifest's samples is warned about;
#  vanished:    a run whose directory is removed mid-run stops, saying so;
#  defaults:    a default run directory taken in the same second gets -2;
#               job.name "", "-rf", ".hidden" refused; an option's value is
#               never the next option (--out --force).
cd "$(dirname "$0")/.." || exit 1
. tests/lib.sh
workdir
synth 300 3
cat > "$W/plan.yaml" <<YAML
job:   { name: r, steps: 2, seed: 5 }
data:  { manifest: $W/data/train.jsonl, image_size: 16, max_text_len: 16, val_samples: 16 }
model: { width: 16, image: { blocks: [1], channels: [8] },
         text: { layers: 1, heads: 2 }, fusion: { layers: 1, heads: 2 } }
train: { batch: 8, microbatches: 2, optimizer: { lr: 1.0e-3, warmup: 1 }, eval_every: 0 }
YAML
# state DIR: every entry under DIR with its size and mtime (what "changes nothing" compares)
state() { find "$1" -printf '%p %s %T@\n' 2>/dev/null | sort; }

# --- a live run: lock and token ---------------------------------------------------------------
L=$W/live
"$BIN" launch "$W/plan.yaml" --out "$L" --steps 100000 --set train.ckpt_every=1 --set train.ckpt_keep=0 >"$W/live.log" 2>&1 &
LPID=$!
for _ in $(seq 200); do [ -e "$L/ckpt/latest" ] && break; sleep 0.1; done
[ -e "$L/ckpt/latest" ] || fail "the live run wrote no checkpoint"
kids=$(pgrep -P "$LPID" | tr '\n' ' ')
[ -n "$kids" ] && ok "live run has stage processes ($kids)" || fail "no stage processes under $LPID"
names=$(for k in $kids; do cat "/proc/$k/comm" 2>/dev/null; done | sort -u | tr '\n' ' ')
[ "$names" = "mmpipe " ] && ok "stage processes are named mmpipe (pgrep -x mmpipe, killall find them)" \
  || fail "stage process names: '$names' (want mmpipe)"
leak=0
for k in $kids; do
  args=$(tr '\0' ' ' < "/proc/$k/cmdline" 2>/dev/null)
  envs=$(tr '\0' '\n' < "/proc/$k/environ" 2>/dev/null)
  if grep -q -- '--token' <<<"$args" || grep -qE '[0-9a-f]{32}' <<<"$args" ||
     grep -qE '^MMP_JOB_TOKEN=.' <<<"$envs"; then
    leak=1; echo "    pid $k: $args"
  fi
done
[ -n "$kids" ] && [ $leak -eq 0 ] && ok "no job token in any stage's argv or environ" \
  || fail "a stage shows the job token"
"$BIN" stage --help | grep -q MMP_JOB_TOKEN && ok "stage --help documents MMP_JOB_TOKEN" \
  || fail "stage --help does not say where the token comes from"
for bad in x -1 2x; do # an index the coordinator never writes is refused before anything starts
  expect_fail "stage --replica '$bad' is a usage error" "--replica takes a replica index, got '$bad'" \
    env MMP_JOB_TOKEN=00 "$BIN" stage --connect ipc://@nowhere --stage image.0 --replica "$bad"
done
expect_fail "stage with an unknown option says so" "unknown option '--bogus'" \
  env MMP_JOB_TOKEN=00 "$BIN" stage --bogus x
# a stage removes everything under its --shm-prefix when its coordinator is gone: only a
# job's own prefix is taken ("/mmpipe-" alone would be every job's on the host)
for bad in /mmpipe- /mmpipe-0123456789ab-x /tmp/x /mmpipe-0123456789AB; do
  expect_fail "stage --shm-prefix '$bad' is a usage error" "--shm-prefix takes a job's prefix" \
    env MMP_JOB_TOKEN=00 "$BIN" stage --connect ipc://@nowhere --stage image.0 --replica 0 --shm-prefix "$bad"
done

before=$(state "$L/ckpt/step_0000001"; state "$L/plan.json"; ls -a "$L")
expect_fail "--force into a live run is refused naming its pid" "in use .*pid $LPID" \
  "$BIN" launch "$W/plan.yaml" --out "$L" --force
expect_fail "--resume of a live run is refused naming its pid" "in use .*pid $LPID" \
  "$BIN" launch "$W/plan.yaml" --resume "$L" --steps 500
expect_fail "--single-process --force into a live run is refused" "in use .*pid $LPID" \
  "$BIN" launch "$W/plan.yaml" --out "$L" --force --single-process
# ... and one that has no checkpoint yet: named by its pid, not "no checkpoint" (its
# lock held here by a stand-in: the same kind of lock, fcntl's)
if command -v python3 >/dev/null; then
  mkdir -p "$W/young"
  python3 -c 'import fcntl, sys, time
f = open(sys.argv[1] + "/.mmpipe.lock", "w"); fcntl.lockf(f, fcntl.LOCK_EX); time.sleep(30)' "$W/young" &
  holder=$!
  for _ in $(seq 50); do [ -e "$W/young/.mmpipe.lock" ] && break; sleep 0.1; done; sleep 0.2
  expect_fail "--resume of a live run without a checkpoint yet names its pid" "in use .*pid $holder" \
    "$BIN" launch "$W/plan.yaml" --resume "$W/young"
  kill $holder; wait $holder 2>/dev/null
else echo "skip: --resume of a young live run (no python3 to hold its lock)"; fi
after=$(state "$L/ckpt/step_0000001"; state "$L/plan.json"; ls -a "$L")
[ "$before" = "$after" ] && [ -e "$L/ckpt/step_0000001" ] && ok "refused launches left the live run alone" \
  || fail "a refused launch changed the live run"
kill -INT "$LPID"; wait "$LPID"
n=$(cat "$L/metrics.jsonl" 2>/dev/null | wc -l)
torn=$(cat "$L/metrics.jsonl" 2>/dev/null | grep -cvE '^\{"step":.*\}$')
[ "$torn" -eq 0 ] && [ "$n" -ge 1 ] && ok "live run's metrics intact ($n lines, none torn)" \
  || fail "live run's metrics.jsonl: $n lines, $torn torn"

# a dead holder's lock file does not block
"$BIN" launch "$W/plan.yaml" --out "$W/dead" --steps 100000 --single-process >"$W/dead.log" 2>&1 &
DPID=$!
for _ in $(seq 100); do [ -s "$W/dead/.mmpipe.lock" ] && break; sleep 0.1; done
kill -KILL "$DPID"; wait "$DPID" 2>/dev/null
"$BIN" launch "$W/plan.yaml" --out "$W/dead" --force --single-process >"$W/dead2.log" 2>&1 \
  && ok "a killed run's lock does not block --force" || { fail "stale lock blocked"; tail -3 "$W/dead2.log"; }

# --- a failed start: replaced without --force; steps or checkpoints still need it -------------
# A stage that dies before step 1 (here: the first image of the manifest is missing, which
# preflight does not open) leaves plan.json, trace.json and an empty metrics.jsonl: no step,
# no checkpoint. The same launch again, with the data fixed, replaces it and says so.
S=$W/started
sed '1s|images/[^"]*|images/missing.png|' "$W/data/train.jsonl" >"$W/data/bad_first.jsonl"
"$BIN" launch "$W/plan.yaml" --out "$S" --set data.manifest="$W/data/bad_first.jsonl" >"$W/started.log" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "missing image" "$W/started.log" && [ -e "$S/metrics.jsonl" ] && [ ! -s "$S/metrics.jsonl" ] \
  && [ ! -e "$S/ckpt" ] && ok "a launch whose stage dies before step 1 fails (rc $rc), no step, no checkpoint" \
  || { fail "the failed start (rc $rc)"; tail -3 "$W/started.log"; }
"$BIN" launch "$W/plan.yaml" --out "$S" >"$W/started2.log" 2>&1 \
  && grep -q "stopped before its first step .*replacing it" "$W/started2.log" \
  && [ "$(wc -l < "$S/metrics.jsonl")" -eq 2 ] && [ -e "$S/ckpt/latest" ] \
  && ok "the same launch again replaces the failed start without --force, saying so" \
  || { fail "re-launch after a failed start"; tail -3 "$W/started2.log"; }
before=$(state "$S")
expect_fail "a run with steps still needs --force" "already holds a run .*pass --force" \
  "$BIN" launch "$W/plan.yaml" --out "$S"
"$BIN" launch "$W/plan.yaml" --out "$W/zero" --steps 0 >"$W/zero.log" 2>&1 || fail "a 0-step run"
before0=$(state "$W/zero")
expect_fail "a run with a checkpoint and no step still needs --force" "already holds a run .*pass --force" \
  "$BIN" launch "$W/plan.yaml" --out "$W/zero"
[ "$before" = "$(state "$S")" ] && [ "$before0" = "$(state "$W/zero")" ] \
  && ok "... and the refusals changed nothing" || fail "a refused launch changed a run"

# --- no shell: odd paths ----------------------------------------------------------------------
R=$W/runs
mkdir -p "$R/victim" && echo keep > "$R/victim/precious"
for d in "$R/victim' 'x" "$R/it's" "$R/two words \"quoted\"" "$R/new
line"; do
  name=$(printf '%q' "$d")
  "$BIN" launch "$W/plan.yaml" --single-process --out "$d" >"$W/odd.log" 2>&1 || { fail "run into $name"; continue; }
  "$BIN" launch "$W/plan.yaml" --single-process --out "$d" --force --steps 1 >"$W/odd.log" 2>&1 \
    || { fail "--force into $name"; tail -3 "$W/odd.log"; continue; }
  [ ! -e "$d/ckpt/step_0000002" ] && [ -e "$d/ckpt/step_0000001" ] && [ "$(wc -l < "$d/metrics.jsonl")" -eq 1 ] \
    && ok "--force replaced the run in $name" || fail "--force left the old run in $name"
done
[ -f "$R/victim/precious" ] && ok "--out \"runs/victim' 'x\" left runs/victim alone" \
  || fail "runs/victim was deleted"

# --- resume fingerprint -----------------------------------------------------------------------
F=$W/fp
"$BIN" launch "$W/plan.yaml" --single-process --out "$F" >"$W/fp.log" 2>&1 || fail "fingerprint base run"
grep -q '^model.text.heads=2$' "$F/ckpt/latest/fingerprint.txt" 2>/dev/null \
  && ok "the checkpoint holds its fingerprint" || fail "no fingerprint.txt in the checkpoint"
before=$(state "$F")
expect_fail "--resume with other model.text.heads (same shapes) is refused naming it" \
  "model.text.heads: .*model.text.heads=2.*model.text.heads=1" \
  "$BIN" launch "$W/plan.yaml" --resume "$F" --steps 4 --set model.text.heads=1
expect_fail "--resume with another job.seed is refused naming it" "job.seed" \
  "$BIN" launch "$W/plan.yaml" --resume "$F" --steps 4 --set job.seed=6
expect_fail "--resume with another train.batch is refused naming it" "train.batch" \
  "$BIN" launch "$W/plan.yaml" --resume "$F" --steps 4 --set train.batch=6 --set train.microbatches=2
expect_fail "pipeline --resume with other model.fusion.heads is refused" "model.fusion.heads" \
  "$BIN" launch "$W/plan.yaml" --resume "$F" --steps 4 --set model.fusion.heads=1
for mode in --single-process ""; do # job.steps is the run's total: step 2 is past --steps 1
  expect_fail "--resume past job.steps is refused, saying so ${mode:-(pipeline)}" \
    "checkpoint is at step 2, past job.steps 1" "$BIN" launch "$W/plan.yaml" --resume "$F" --steps 1 $mode
done
[ "$before" = "$(state "$F")" ] && ok "refused resumes changed nothing on disk" \
  || { fail "a refused resume changed the run"; diff <(echo "$before") <(state "$F") | head -5; }
"$BIN" launch "$W/plan.yaml" --resume "$F" --steps 4 --set train.microbatches=4 \
  --set 'stages.image.replicas=2' --set train.optimizer.lr=5e-4 >"$W/fp2.log" 2>&1 \
  && [ "$(wc -l < "$F/metrics.jsonl")" -eq 4 ] \
  && ok "resume may change steps, micro-batches, lr and placement" || { fail "legit resume refused"; tail -3 "$W/fp2.log"; }

# --- preflight --------------------------------------------------------------------------------
expect_fail "missing manifest: one error naming data.manifest" "data.manifest: .*$W/nope.jsonl" \
  "$BIN" launch "$W/plan.yaml" --out "$W/pf1" --set data.manifest="$W/nope.jsonl"
n=$("$BIN" launch "$W/plan.yaml" --out "$W/pf1" --set data.manifest="$W/nope.jsonl" 2>&1 | grep -c nope.jsonl)
[ "$n" -eq 1 ] && [ ! -e "$W/pf1" ] && ok "... printed once, no run directory" \
  || fail "missing manifest printed $n times or left $W/pf1"
# where the key was given leads the error: file:line:column, or the --set
printf 'job: { name: pf, steps: 2 }\ndata:\n  manifest: nope.jsonl\n' >"$W/pf8.yaml"
expect_fail "missing manifest: the error names file:line:column" "^mmpipe launch: $W/pf8.yaml:3:13: data.manifest: cannot read $W/nope.jsonl" \
  "$BIN" launch "$W/pf8.yaml" --out "$W/pf8"
expect_fail "missing manifest from --set: the error names the --set" "^mmpipe launch: --set data.manifest=$W/nope.jsonl: data.manifest: cannot read" \
  "$BIN" launch "$W/plan.yaml" --out "$W/pf8" --set data.manifest="$W/nope.jsonl"
mkdir -p "$W/novocab" && cp "$W/data/train.jsonl" "$W/novocab/" && printf 'job: { name: pf, steps: 2 }\ndata: { manifest: novocab/train.jsonl }\n' >"$W/pf9.yaml"
expect_fail "missing default vocab: named at the manifest's position, as a default" \
  "^mmpipe launch: $W/pf9.yaml:2:19: data.vocab: cannot read $W/novocab/vocab.txt: .*\\(the default: beside data.manifest\\)" \
  "$BIN" launch "$W/pf9.yaml" --out "$W/pf9"
expect_fail "missing vocab: error naming data.vocab" "data.vocab: .*$W/none.txt" \
  "$BIN" launch "$W/plan.yaml" --out "$W/pf2" --set data.vocab="$W/none.txt"
mkdir -p "$W/noval" && cp "$W/data/train.jsonl" "$W/data/vocab.txt" "$W/noval/" && ln -s "$W/data/images" "$W/noval/images"
expect_fail "missing validation set named in the plan: error naming data.val_manifest" "data.val_manifest: .*noval/held.jsonl" \
  "$BIN" launch "$W/plan.yaml" --out "$W/pf3" --set data.manifest="$W/noval/train.jsonl" --set data.val_manifest="$W/noval/held.jsonl"
mkdir -p "$W/empty" && cp "$W/data/vocab.txt" "$W/empty/" && printf '\n  \n' >"$W/empty/train.jsonl" && : >"$W/empty/val.jsonl"
expect_fail "empty manifest (blank lines only): error naming data.manifest" \
  "data.manifest: .*empty/train.jsonl: no samples" \
  "$BIN" launch "$W/plan.yaml" --out "$W/pf6" --set data.manifest="$W/empty/train.jsonl"
cp "$W/data/train.jsonl" "$W/empty/train.jsonl" && ln -s "$W/data/images" "$W/empty/images"
expect_fail "empty val.jsonl beside the manifest: error naming data.val_manifest" \
  "data.val_manifest: .*empty/val.jsonl: no samples" \
  "$BIN" launch "$W/plan.yaml" --out "$W/pf7" --set data.manifest="$W/empty/train.jsonl"
[ ! -e "$W/pf2" ] && [ ! -e "$W/pf3" ] && [ ! -e "$W/pf6" ] && [ ! -e "$W/pf7" ] && [ ! -e "$W/pf8" ] && [ ! -e "$W/pf9" ] \
  && ok "no run directory after a preflight error" || fail "preflight left a directory"
"$BIN" launch "$W/plan.yaml" --out "$W/pf4" --set data.manifest="$W/noval/train.jsonl" \
  --set train.final_eval=false >"$W/pf4.log" 2>&1 \
  && ! grep -q val_i2t_r1 "$W/pf4/metrics.jsonl" && ok "evaluation off: no validation set needed" \
  || { fail "evaluation off still wants val.jsonl"; tail -3 "$W/pf4.log"; }
"$BIN" launch "$W/plan.yaml" --out "$W/pf5" --set data.manifest="$W/noval/train.jsonl" \
  --set train.eval_every=1 >"$W/pf5.log" 2>&1 \
  && ! grep -q val_i2t_r1 "$W/pf5/metrics.jsonl" && grep -q "no validation set .*evaluation is off" "$W/pf5.log" \
  && grep -q '"val_manifest": ""' "$W/pf5/plan.json" \
  && ok "no val.jsonl beside the manifest: runs, says evaluation is off" \
  || { fail "no val.jsonl beside the manifest"; tail -3 "$W/pf5.log"; }

# --- paths relative to the plan file, recorded absolute --------------------------------------
mkdir -p "$W/plans"
sed "s|manifest: $W/data/train.jsonl|manifest: ../data/./train.jsonl|" "$W/plan.yaml" > "$W/plans/rel.yaml"
case $BIN in /*) ABS_BIN=$BIN ;; *) ABS_BIN=$PWD/$BIN ;; esac
(cd / && "$ABS_BIN" launch "$W/plans/rel.yaml" --out "$W/rel1" --steps 1 --set train.eval_every=1) >"$W/rel1.log" 2>&1 \
  && grep -q "\"manifest\": \"$W/data/train.jsonl\"" "$W/rel1/plan.json" \
  && grep -q "\"val_manifest\": \"$W/data/val.jsonl\"" "$W/rel1/plan.json" \
  && grep -q "\"vocab\": \"$W/data/vocab.txt\"" "$W/rel1/plan.json" \
  && grep -q val_i2t_r1 "$W/rel1/metrics.jsonl" \
  && ok "launched from / with manifest: ../data/train.jsonl: resolved beside the plan, absolute in plan.json" \
  || { fail "plan-relative paths from another directory"; tail -3 "$W/rel1.log"; }
(cd "$W" && "$ABS_BIN" launch plans/rel.yaml --out rel2 --steps 1 --single-process) >"$W/rel2.log" 2>&1 \
  && grep -q "\"manifest\": \"$W/data/train.jsonl\"" "$W/rel2/plan.json" 2>/dev/null \
  && ok "a relative plan path from its parent folder (single process)" \
  || { fail "relative plan path"; tail -3 "$W/rel2.log"; }
(cd "$W/data" && "$ABS_BIN" launch "$W/plans/rel.yaml" --out "$W/rel3" --steps 1 --set data.vocab=vocab.txt) >"$W/rel3.log" 2>&1 \
  && grep -q "\"vocab\": \"$W/data/vocab.txt\"" "$W/rel3/plan.json" \
  && ok "--set data.vocab=vocab.txt is relative to the current directory" \
  || { fail "--set path relative to the current directory"; tail -3 "$W/rel3.log"; }
# A relative --out, stages started in another directory (hosts[].workdir;
# launcher: ssh through `env ... sh -c`, no sshd): they get the run
# directory from the root, so the whole run lands in the one directory.
mkdir -p "$W/elsewhere"
{ cat "$W/plan.yaml"; echo "launcher: ssh"; echo "launcher_command: env MMP_HOST={address} sh -c"
  echo "hosts: [ { name: a, address: 127.0.0.1, devices: [cpu, cpu, cpu], workdir: $W/elsewhere, binary: $ABS_BIN } ]"
} >"$W/plans/workdir.yaml"
(cd "$W" && "$ABS_BIN" launch plans/workdir.yaml --out rel4 --steps 2) >"$W/rel4.log" 2>&1 \
  && [ -s "$W/rel4/ckpt/latest/fusion.ckpt" ] && [ -z "$(ls -A "$W/elsewhere")" ] \
  && grep -q "resume with\|done: 2 steps" "$W/rel4.log" \
  && ok "relative --out, stages in hosts[].workdir elsewhere: the run is whole in --out" \
  || { fail "relative --out with hosts[].workdir elsewhere"; tail -3 "$W/rel4.log"; }

# --- vocab coverage: English captions under the synthetic set's 64-token vocab warn ---------
E=$W/english
mkdir -p "$E" && ln -s "$W/data/images" "$E/images" && cp "$W/data/vocab.txt" "$E/"
captions=("A man riding a bicycle down a busy city street." "Two dogs playing with a ball on the grass."
  "A bowl of fresh fruit sits on the kitchen table." "Children are building a sandcastle at the beach.")
i=0
while IFS= read -r line; do
  img=$(sed -n 's/.*"image": "\([^"]*\)".*/\1/p' <<<"$line")
  printf '{"image": "%s", "text": "%s"}\n' "$img" "${captions[$((i % 4))]}"; i=$((i+1))
done < "$W/data/train.jsonl" > "$E/train.jsonl"
"$BIN" launch "$W/plan.yaml" --out "$W/unk1" --steps 1 --set data.manifest="$E/train.jsonl" >"$W/unk1.log" 2>&1 \
  && grep -q "warning: [0-9]*% of the caption word pieces in the first [0-9]* lines of $E/train.jsonl are \[UNK\] under data.vocab $E/vocab.txt (64 tokens)" "$W/unk1.log" \
  && grep -q "scripts/vocab" "$W/unk1.log" \
  && ok "English captions with the 64-token vocab: launch warns about [UNK], names scripts/vocab" \
  || { fail "no [UNK] warning for English captions under the demo vocab"; tail -3 "$W/unk1.log"; }
"$BIN" launch "$W/plan.yaml" --out "$W/unk2" --steps 1 --set data.manifest="$E/train.jsonl" \
  --set data.vocab=tests/tokenizer/vocab.txt >"$W/unk2.log" 2>&1 \
  && ! grep -q "UNK" "$W/unk2.log" && grep -q "\"vocab\": \"$PWD/tests/tokenizer/vocab.txt\"" "$W/unk2/plan.json" \
  && ok "... and none with bert-base-uncased's vocab (tests/tokenizer/vocab.txt, as scripts/vocab writes)" \
  || { fail "[UNK] warning with the real vocab"; tail -3 "$W/unk2.log"; }
! grep -q "UNK" "$W/pf4.log" && ok "... nor for the synthetic captions with their own vocab" \
  || fail "[UNK] warning on the synthetic set"
# data tokenize: a line a manifest would refuse (not UTF-8, a NUL) is tokenized all the same,
# one output line per input line, and said with its line and column
printf 'a red \xff square\nhello\0world\na red square\n' \
  | "$BIN" data tokenize --vocab tests/tokenizer/vocab.txt >"$W/tok.out" 2>"$W/tok.err"; rc=$?
[ $rc -eq 0 ] && [ "$(wc -l <"$W/tok.out")" -eq 3 ] && [ "$(wc -l <"$W/tok.err")" -eq 2 ] \
  && grep -q "^mmpipe data tokenize: stdin:1:7: not UTF-8 text; the tokenizer drops it" "$W/tok.err" \
  && grep -q "^mmpipe data tokenize: stdin:2:6: a NUL byte; the tokenizer drops it" "$W/tok.err" \
  && ok "data tokenize: bytes a manifest refuses are tokenized, said with line:column" \
  || { fail "data tokenize of bad bytes: rc $rc"; cat "$W/tok.err"; }

# a bad validation image under on_bad_sample: skip is skipped, not fatal
B=$W/badval
mkdir -p "$B/images" && cp "$W/data/"*.jsonl "$W/data/vocab.txt" "$B/" && cp "$W/data/images/"* "$B/images/"
img=$(sed -n '3s/.*"image": "\([^"]*\)".*/\1/p' "$B/val.jsonl")
echo "not a picture" > "$B/$img"
for mode in "" --single-process; do
  "$BIN" launch "$W/plan.yaml" $mode --out "$W/bv$mode" --set data.manifest="$B/train.jsonl" \
    --set data.on_bad_sample=skip --set train.eval_every=1 >"$W/bv.log" 2>&1 \
    && [ "$(grep -c val_i2t_r1 "$W/bv$mode/metrics.jsonl")" -eq 2 ] && grep -q "1 of 16 validation pairs skipped" "$W/bv.log" \
    && ok "skip: a bad validation image is skipped and counted ${mode:-(pipeline)}" \
    || { fail "skip: a bad validation image ${mode:-(pipeline)}"; tail -3 "$W/bv.log"; }
done
expect_fail "fail: a bad validation image still stops the run, naming it" "val.jsonl:3" \
  "$BIN" launch "$W/plan.yaml" --single-process --out "$W/bvf" --set data.manifest="$B/train.jsonl" --set train.eval_every=1

# a batch larger than the manifest: warned once (every batch repeats samples)
"$BIN" launch "$W/plan.yaml" --single-process --out "$W/bigb" --steps 1 --set train.batch=400 >"$W/bigb.log" 2>&1 \
  && grep -q "warning: train.batch 400 is more than the 300 samples of .*train.jsonl" "$W/bigb.log" \
  && ! grep -q "is more than the" "$W/pf4.log" \
  && ok "a batch larger than the manifest is warned about, naming both counts" || { fail "no small-manifest warning"; tail -3 "$W/bigb.log"; }

# default run directories: a launch in the same second as another gets
# <name>-<time>-2 (mkdir claims it), never the other's; the name must make a
# plain directory name
D=$W/defaults; mkdir -p "$D/runs"
t0=$(date +%s)
for s in $(seq 0 5); do # the next seconds' names already taken by runs with steps
  d=$D/runs/r-$(date -d "@$((t0 + s))" +%Y%m%d-%H%M%S); mkdir -p "$d"; echo '{"step":1}' >"$d/metrics.jsonl"
done
taken() { for d in "$D"/runs/r-*; do case $d in *-2) ;; *) state "$d" ;; esac; done; }
before=$(taken)
(cd "$D" && "$BIN" launch "$W/plan.yaml" --steps 0) >"$W/def.log" 2>&1; rc=$?
made=$(cd "$D/runs" && ls -d r-*-2 2>/dev/null)
[ $rc -eq 0 ] && [ -n "$made" ] && [ -e "$D/runs/$made/ckpt/latest" ] && [ "$before" = "$(taken)" ] \
  && ok "a default run directory taken that second: the launch makes $made, the other is untouched" \
  || { fail "default run directory collision (rc $rc, made '$made')"; tail -3 "$W/def.log"; ls "$D/runs"; }
for name in "''" "-rf" ".hidden"; do
  expect_fail "job.name $name refused" "job.name: '${name//\'/}' names the run directory" \
    "$BIN" launch "$W/plan.yaml" --steps 0 --set "job.name=$name"
done

# the run directory removed while the run writes it: the run stops, saying
# so, rather than write on into files nobody sees or make the directory anew
for mode in "" --single-process; do
  G=$W/vanish${mode:+-single}
  "$BIN" launch "$W/plan.yaml" $mode --out "$G" --steps 100000 --set train.ckpt_every=0 >"$W/vanish.log" 2>&1 &
  VP=$!
  for _ in $(seq 300); do [ -s "$G/metrics.jsonl" ] && break; sleep 0.1; done
  rm -rf "$G"
  for _ in $(seq 300); do kill -0 $VP 2>/dev/null || break; sleep 0.1; done
  kill -0 $VP 2>/dev/null && kill -KILL $VP
  wait $VP; rc=$?
  [ $rc -eq 1 ] && grep -q "metrics.jsonl is not the file this run writes (gone): was the run directory removed?" "$W/vanish.log" \
    && [ ! -e "$G" ] && ok "a run whose directory is removed stops (rc 1), saying so, and makes none anew (${mode:-pipeline})" \
    || { fail "run directory removed mid-run (${mode:-pipeline}): rc $rc"; tail -3 "$W/vanish.log"; ls -R "$G" 2>/dev/null | head -5; }
done

# an option that takes a value never swallows the next option
expect_fail "launch --out --force: a usage error, no directory named --force" "--out needs a value, not the option '--force'" \
  env -C "$W" "$BIN" launch "$W/plan.yaml" --out --force
[ ! -e "$W/--force" ] && ok "... and nothing was made" || fail "a directory named --force"
expect_fail "ckpt export -o --optimizer: a usage error" "-o needs a value, not the option '--optimizer'" \
  "$BIN" ckpt export "$L" -o --optimizer
# an empty value, a value option twice, --resume of what is no run directory
expect_fail "launch --out '': a usage error" "--out needs a value, got an empty one" \
  "$BIN" launch "$W/plan.yaml" --out ''
expect_fail "launch --steps twice: a usage error (which one was meant?)" "--steps given twice" \
  "$BIN" launch "$W/plan.yaml" --steps 2 --out "$W/twice" --steps 3
[ ! -e "$W/twice" ] && ok "... and nothing was made" || fail "a run directory for the --steps given twice"
expect_fail "simulate --costs twice: a usage error" "--costs given twice" \
  "$BIN" simulate "$W/plan.yaml" --costs "$L" --costs "$L"
expect_fail "--resume of a missing directory says so" "--resume $W/nothere: No such file or directory" \
  "$BIN" launch "$W/plan.yaml" --resume "$W/nothere"
expect_fail "--resume of a file says it is not a directory" "--resume $W/plan.yaml: not a directory" \
  "$BIN" launch "$W/plan.yaml" --resume "$W/plan.yaml"
out=$("$BIN" --version extra 2>&1); rc=$?
[ $rc -eq 2 ] && [ "$out" = "mmpipe: --version takes nothing after it, got 'extra'" ] \
  && ok "--version with more after it: a usage error saying so" || fail "--version extra: rc $rc: $out"

finish
