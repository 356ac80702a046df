#!/usr/bin/env bash
# tests/reaper.c, the guard every ctest runs under: a test that leaves a
# process behind (a disowned `sleep &`, a double-forked daemon, one started in
# another network namespace), an mmpipe /dev/shm entry or a network namespace
# fails (exit 1), each is named on stderr and is gone afterwards; a clean test
# passes and says nothing; a failing test keeps its own exit status (a signal
# too), 77 (ctest's skip) passes through; SIGTERM reaches the test; a `kill 0`
# in the test does not take the guard with it. Runs as root for the /dev/shm
# and namespace cases (a private /dev/shm needs a mount namespace).
source "$(dirname "$0")/lib.sh"
R=${MMP_REAPER:-build/tests/reaper}
[ -x "$R" ] || { echo "no $R (build first)"; exit 1; }
workdir
ulimit -c 0
# run SCRIPT: the guard on `bash -c SCRIPT`; sets rc and out (its stderr and stdout)
# (not root: without the line saying that /dev/shm is not checked)
run() {
  out=$(MMP_REAPER_LOG="$W/log" "$R" t bash -c "$1" 2>&1); rc=$?
  out=$(grep -v '^reaper: [a-z]*: /dev/shm not checked' <<<"$out")
}
gone() { ! kill -0 "$1" 2>/dev/null; }
show() { echo "$out" | sed 's/^/    /'; }

run 'echo hello >/dev/null'
[ $rc -eq 0 ] && [ -z "$out" ] && ok "a clean test: 0, nothing said" || { fail "clean: rc=$rc"; show; }
: >"$W/log"
run "$R inner true; echo \${MMP_REAPER_LOG:-unset}"
[ "$(cat "$W/log")" = "t: 0 left behind" ] && [ "$out" = unset ] \
  && ok "MMP_REAPER_LOG: one line per test, the test does not inherit it" \
  || { fail "log: '$(cat "$W/log")', test saw '$out'"; }

run "sleep 300 >/dev/null 2>&1 & echo \$! >$W/p1"
p=$(cat "$W/p1")
[ $rc -eq 1 ] && grep -q "^reaper: t: left behind: pid $p: sleep 300$" <<<"$out" && gone "$p" \
  && ok "a disowned sleep: 1, named, killed" || { fail "disowned: rc=$rc, pid $p"; show; }

# a daemon's double fork: the middle process exits, the sleep is nobody's child
run "( setsid sleep 301 </dev/null >/dev/null 2>&1 & echo \$! >$W/p2 ); exit 0"
p=$(cat "$W/p2")
[ $rc -eq 1 ] && grep -q "left behind: pid $p: sleep 301" <<<"$out" && gone "$p" \
  && ok "a double-forked daemon: 1, named, killed" || { fail "daemon: rc=$rc, pid $p"; show; }

run "sleep 304 >/dev/null 2>&1 & echo \$! >$W/p3; exit 3"
p=$(cat "$W/p3")
[ $rc -eq 3 ] && grep -q "left behind: pid $p: sleep 304" <<<"$out" && gone "$p" \
  && ok "a failing test keeps its status (3), its leftover still named and killed" \
  || { fail "failing: rc=$rc"; show; }

out=$(MMP_REAPER_PRIVATE_SHM=0 "$R" t bash -c "sleep 305 >/dev/null 2>&1 & echo \$! >$W/p5" 2>&1); rc=$?
p=$(cat "$W/p5")
[ $rc -eq 1 ] && grep -q "^reaper: t: /dev/shm not checked (MMP_REAPER_PRIVATE_SHM=0)" <<<"$out" \
  && grep -q "left behind: pid $p: sleep 305" <<<"$out" && gone "$p" \
  && ok "MMP_REAPER_PRIVATE_SHM=0: /dev/shm said unchecked, processes still caught" \
  || { fail "MMP_REAPER_PRIVATE_SHM=0: rc=$rc"; show; }

run 'exit 77'
[ $rc -eq 77 ] && ok "77 (skip) passes through" || fail "skip: rc=$rc"

run 'kill -SEGV $$'
[ $rc -eq 139 ] && ok "a test killed by SIGSEGV: the guard dies of it too (rc 139)" || { fail "signal: rc=$rc"; show; }

run '( sleep 0.3 >/dev/null 2>&1 & ); exit 0'
[ $rc -eq 0 ] && [ -z "$out" ] && ok "a process on its way out (0.3 s) is not a leftover" \
  || { fail "grace: rc=$rc"; show; }

: >"$W/log"
run 'kill 0'
[ $rc -eq 143 ] && [ "$(cat "$W/log")" = "t: 0 left behind" ] \
  && ok "kill 0 in the test stays in the test (the guard logged it)" \
  || { fail "kill 0: rc=$rc, log '$(cat "$W/log")'"; show; }

# SIGTERM (ctest's timeout) to the guard reaches the test's processes
rm -f "$W/ready"
"$R" t bash -c "trap 'exit 5' TERM; sleep 200 >/dev/null 2>&1 & echo \$! >$W/p4; touch $W/ready; wait" \
  >"$W/term.out" 2>&1 &
g=$!
for _ in $(seq 200); do [ -e "$W/ready" ] && break; sleep 0.05; done
kill -TERM $g; wait $g; rc=$?
[ $rc -eq 5 ] && gone "$(cat "$W/p4")" && ! grep -q "left behind" "$W/term.out" \
  && ok "SIGTERM to the guard reaches the test's group (its trap's 5, its sleep gone)" \
  || { fail "SIGTERM: rc=$rc"; sed 's/^/    /' "$W/term.out"; }

"$R" >/dev/null 2>&1; rc=$?
[ $rc -eq 2 ] && ok "no command: usage, 2" || fail "usage: rc=$rc"

if [ "$(id -u)" -ne 0 ]; then
  echo "(not root: no private /dev/shm, the /dev/shm and namespace cases are not run)"
  finish; exit $?
fi

run 'echo x >/dev/shm/mmpipe-reaper-test; echo y >/dev/shm/other-reaper-test'
[ $rc -eq 1 ] && grep -q "left in /dev/shm: mmpipe-reaper-test$" <<<"$out" \
  && grep -q "note: /dev/shm/other-reaper-test remained" <<<"$out" && [ "$(grep -c 'left' <<<"$out")" = 1 ] \
  && ok "an mmpipe /dev/shm entry: 1, named; another name only noted" || { fail "shm: rc=$rc"; show; }
: >/dev/shm/mmpipe-reaper-outside
run '[ ! -e /dev/shm/mmpipe-reaper-outside ] && : >/dev/shm/mmpipe-reaper-inside-$$ && sleep 0.2 && ls /dev/shm'
[ $rc -eq 1 ] && grep -q "^mmpipe-reaper-inside-[0-9]*$" <<<"$out" && [ -e /dev/shm/mmpipe-reaper-outside ] \
  && ! ls /dev/shm | grep -q "mmpipe-reaper-inside" \
  && ok "the test's /dev/shm is its own: the entry outside not in it and left alone" \
  || { fail "private /dev/shm: rc=$rc"; show; }
rm -f /dev/shm/mmpipe-reaper-outside

ns=mrp$$
run "ip netns add $ns || exit 9; ip netns exec $ns setsid sleep 302 </dev/null >/dev/null 2>&1 & echo \$! >$W/p5"
p=$(cat "$W/p5" 2>/dev/null)
if [ $rc -eq 9 ]; then
  echo "(network namespaces cannot be made here: that case is not run)"
else
  [ $rc -eq 1 ] && [ -n "$p" ] && grep -q "left behind: pid $p: sleep 302" <<<"$out" \
    && grep -q "left behind: network namespace $ns (ip netns)" <<<"$out" && gone "$p" \
    && [ ! -e "/run/netns/$ns" ] && ! ip netns list | grep -q "^$ns" \
    && ok "a process in a network namespace and the namespace: 1, both named and removed" \
    || { fail "netns: rc=$rc, pid '$p'"; show; ip netns del "$ns" 2>/dev/null; }
  # a namespace made outside while the test runs (another test's, the machine's)
  # is not the test's: neither named nor touched (mrpa first makes /run/netns a
  # shared mount, as on a machine where ip netns was used before)
  if ip netns add "mrpa$$"; then
    rm -f "$W/in" "$W/added"
    "$R" t bash -c "touch $W/in; for i in \$(seq 200); do [ -e $W/added ] && exit 0; sleep 0.05; done; exit 8" \
      >"$W/o.out" 2>&1 &
    g=$!
    for _ in $(seq 200); do [ -e "$W/in" ] && break; sleep 0.05; done
    ip netns add "mrpb$$"; touch "$W/added"
    wait $g; rc=$?
    [ $rc -eq 0 ] && [ ! -s "$W/o.out" ] && ip netns exec "mrpb$$" true \
      && ok "a namespace made outside meanwhile: not named, still there" \
      || { fail "outside namespace: rc=$rc"; sed 's/^/    /' "$W/o.out"; }
    ip netns del "mrpb$$"; ip netns del "mrpa$$"
  fi
fi
finish
