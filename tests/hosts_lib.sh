# Namespace "hosts" for the multi-host tests and benches (sourced, not a test;
# tests/cli_hosts.sh, tests/cli_hosts_balance.sh, bench/hosts_balance.sh):
# hosts_up NAME... makes a coordinator namespace ${P}c holding a bridge at
# 10.77.0.1 and one namespace per NAME (10.77.0.2, .3, ... in order), each
# running its own sshd with keys made here (config in $W/ssh, nothing in
# /root/.ssh or /etc touched); hosts_down undoes it (trap it on EXIT).
# HOSTS_SSHD=0: no sshd (tests/cli_slurm.sh starts slurmd there instead).
# Returns 77 when network namespaces cannot be made here, 1 on another failure.
# Sets P (the unique name prefix), HOSTS, SSHCFG ($W/ssh/config); ipc CMD runs
# CMD in the coordinator's namespace. Needs W (tests/lib.sh workdir).
hosts_down() {
  local f ns
  for f in "$W"/ssh/sshd-*.pid; do [ -f "$f" ] && kill "$(cat "$f")" 2>/dev/null; done
  for ns in "${HOSTS[@]}" c; do ip netns del "${P}$ns" 2>/dev/null; done
  return 0
}
ipc() { ip netns exec "${P}c" "$@"; }
hosts_up() {
  HOSTS=("$@")
  [ "$(id -u)" -eq 0 ] || { echo "skip: needs root for network namespaces"; return 77; }
  P=m$(printf %05d $((($$ * 131 + RANDOM) % 100000))) # link names stay within 15 characters
  if ! ip netns add "${P}c" 2>"$W/netns.err"; then
    echo "skip: cannot create network namespaces: $(cat "$W/netns.err")"; return 77
  fi
  local sshd h n
  sshd=$(command -v sshd || echo /usr/sbin/sshd)
  [ -x "$sshd" ] || { echo "sshd not installed (scripts/setup installs openssh-server)"; return 1; }
  ipc ip link set lo up
  ipc ip link add br0 type bridge
  ipc ip addr add 10.77.0.1/24 dev br0
  ipc ip link set br0 up
  n=2
  for h in "${HOSTS[@]}"; do
    ip netns add "${P}$h" || return 1
    ip link add "${P}$h" type veth peer name "${P}${h}p"
    ip link set "${P}$h" netns "${P}c"
    ip link set "${P}${h}p" netns "${P}$h"
    ipc ip link set "${P}$h" master br0 up
    ip netns exec "${P}$h" ip link set lo up
    ip netns exec "${P}$h" ip link set "${P}${h}p" name eth0
    ip netns exec "${P}$h" ip addr add "10.77.0.$n/24" dev eth0
    ip netns exec "${P}$h" ip link set eth0 up
    n=$((n + 1))
  done
  [ "${HOSTS_SSHD:-1}" = 0 ] && return 0
  mkdir -p "$W/ssh" && chmod 700 "$W/ssh"
  ssh-keygen -q -t ed25519 -N '' -f "$W/ssh/host" && ssh-keygen -q -t ed25519 -N '' -f "$W/ssh/id" || return 1
  cp "$W/ssh/id.pub" "$W/ssh/authorized_keys"
  : >"$W/ssh/known_hosts"
  mkdir -p /run/sshd
  n=2
  for h in "${HOSTS[@]}"; do
    cat >"$W/ssh/sshd-$h.conf" <<CONF
ListenAddress 10.77.0.$n
HostKey $W/ssh/host
AuthorizedKeysFile $W/ssh/authorized_keys
PidFile $W/ssh/sshd-$h.pid
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
ClientAliveInterval 1
ClientAliveCountMax 3
LogLevel ERROR
AcceptEnv OPENBLAS_CORETYPE
CONF
    ip netns exec "${P}$h" "$sshd" -f "$W/ssh/sshd-$h.conf" -E "$W/ssh/sshd-$h.log" || return 1
    echo "10.77.0.$n $(cut -d' ' -f1-2 "$W/ssh/host.pub")" >>"$W/ssh/known_hosts"
    n=$((n + 1))
  done
  SSHCFG=$W/ssh/config
  cat >"$SSHCFG" <<CONF
User root
IdentityFile $W/ssh/id
IdentitiesOnly yes
UserKnownHostsFile $W/ssh/known_hosts
StrictHostKeyChecking yes
BatchMode yes
ConnectTimeout 5
ServerAliveInterval 1
ServerAliveCountMax 3
LogLevel ERROR
CONF
  local i last=$((n - 1))
  for i in $(seq 50); do
    ipc ssh -F "$SSHCFG" "10.77.0.$last" true 2>/dev/null && return 0
    sleep 0.1
  done
  echo "ssh does not reach 10.77.0.$last"; return 1
}
# remote_left LOG: stage processes of that run still alive on any host (the
# namespaces share this pid space; the run's shm prefix is on their lines);
# "?" when the log names no prefix (nothing can be counted: not a 0)
remote_left() {
  local prefix
  prefix=$(run_prefix "$1")
  [ -n "$prefix" ] || { echo "?"; return; }
  pgrep -f -- "--shm-prefix $prefix( |\$)" | wc -l
}
# nothing_left NAME LOG: no stage (local ssh client or remote stage) and no shm
nothing_left() {
  local r; r=$(remote_left "$2")
  if [ "$r" = "?" ]; then fail "$1: $2 names no shm prefix: remote stages not counted"
  elif [ "$r" -eq 0 ]; then ok "$1: no remote stage left"
  else fail "$1: $r remote stages left"; pgrep -af -- --shm-prefix; fi
  left_behind "$1" "$2"
}
