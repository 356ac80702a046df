# Shared preamble of the bench/*.sh scripts (sourced; not a bench itself).
# Sourcing it moves to the repository root. A script then declares its
# options with their defaults and parses its arguments:
#   . "$(dirname "$0")/lib.sh" || exit 1
#   bench_args bench/NAME.sh --out=OUT=runs/x --set=+sets ... -- "$@"
# SPEC --OPT=VAR[=DEFAULT] takes `--OPT VALUE` into VAR (set to DEFAULT
# first when given); --OPT=+ARRAY appends `--OPT VALUE` to ARRAY (emptied
# first); @=VAR takes any other word into VAR (without it, another word is
# an error). -h/--help prints the script's header comment (bench_help).
cd "$(dirname "${BASH_SOURCE[0]}")/.." || exit 1
# bench_help: the calling script's header comment (its lines after the first
# up to the first line that is not a comment), without the "# ".
bench_help() { awk 'NR == 1 { next } !/^#/ { exit } { sub(/^# ?/, ""); print }' "$0"; }
bench_args() {
  BENCH_NAME=$1
  local spec=() s var found
  shift
  while [ $# -gt 0 ] && [ "$1" != -- ]; do
    s=${1#*=}
    case $s in
      +*) eval "${s#+}=()" ;;
      *=*) printf -v "${s%%=*}" '%s' "${s#*=}" ;;
    esac
    spec+=("${1%%=*}=${s%%=*}")
    shift
  done
  shift
  while [ $# -gt 0 ]; do
    case $1 in
      -h | --help) bench_help; exit 0 ;;
    esac
    found=
    for s in "${spec[@]}"; do
      var=${s#*=}
      if [ "${s%%=*}" = "$1" ]; then
        [ $# -ge 2 ] || { echo "$BENCH_NAME: $1 wants a value (see --help)" >&2; exit 2; }
        if [ "${var#+}" != "$var" ]; then
          local -n arr=${var#+}
          arr+=("$1" "$2")
          unset -n arr
        else
          printf -v "$var" '%s' "$2"
        fi
        found=2
        break
      elif [ "${s%%=*}" = @ ]; then
        found=@$var
      fi
    done
    case $found in
      2) shift 2 ;;
      @*) printf -v "${found#@}" '%s' "$1"; shift ;;
      *) echo "$BENCH_NAME: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
  done
}
# say MESSAGE...: a line on stderr, named after the script.
say() { echo "$BENCH_NAME: $*" >&2; }
# bench_need_bin: stops (2) unless $BIN is an executable.
bench_need_bin() {
  [ -x "$BIN" ] || { say "no mmpipe binary at $BIN (scripts/setup builds it)"; exit 2; }
}
# bench_fresh_out: an empty $OUT.
bench_fresh_out() { rm -rf "$OUT" && mkdir -p "$OUT"; }
