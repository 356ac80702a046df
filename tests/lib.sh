# Shared helpers for the tests/cli_*.sh scripts (sourced; not a test itself).
set -uo pipefail
BIN=${MMP_BIN:-build/mmpipe}
TMP=${MMP_TMP:-/tmp/mmpipe-test}
fails=0
checks=0
ok()   { checks=$((checks+1)); echo "ok   $*"; }
fail() { checks=$((checks+1)); fails=$((fails+1)); echo "FAIL $*"; }
# expect_fail NAME PATTERN CMD...: CMD must exit non-zero and print PATTERN (grep -E).
expect_fail() {
  local name=$1 pat=$2; shift 2
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [ $rc -ne 0 ] && grep -qE -- "$pat" <<<"$out"; then ok "$name"
  else fail "$name (rc=$rc, wanted /$pat/):"; echo "$out" | tail -5 | sed 's/^/    /'; fi
}
# last_metric FILE KEY: the value of KEY in the last line of FILE that has it.
last_metric() { grep "\"$2\"" "$1" | tail -1 | sed -E "s/.*\"$2\":([-0-9.e+]+).*/\1/"; }
# median: of the numbers on stdin ("nan" when none).
median() { sort -g | awk '{ v[NR] = $1 } END { print NR ? (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) : "nan" }'; }
# metric FILE KEY FROM TO: KEY of metrics lines FROM..TO (1-based steps), one per line
metric() { sed -n "$3,$4p" "$1" | grep -o "\"$2\":[-0-9.e+]*" | sed 's/.*://'; }
# same_ckpt A B: `ckpt diff A B` finds no difference at all (max_abs_diff=0);
# prints the diff's last line either way.
same_ckpt() {
  local out rc last
  out=$("$BIN" ckpt diff "$1" "$2" --quiet); rc=$?
  last=$(tail -1 <<<"$out"); echo "$last"
  [ $rc -eq 0 ] && [ "$last" = "max_abs_diff=0 max_rel_diff=0" ]
}
finish() {
  echo "$(basename "$0"): $checks checks, $fails failed"
  [ $checks -gt 0 ] && [ $fails -eq 0 ]
}
