#!/usr/bin/env bash
# OSPF on a generated topology: time from `up` to every router reaching
# every other's loopback (read in the kernels), and the memory per router.
#
#   scripts/ospf-converge.sh [-b NSFLEET] [-H HELLO] SHAPE ARGS...   e.g. torus 10 10
#
# Every router runs Debian's BIRD (bird2) from a config of its own, as
# `nsfleet topo --bird HELLO` writes it: router id its loopback, OSPF
# point to point on eth*, hello HELLO seconds (default 1), dead after 4
# hellos, only the /32 loopbacks exported to the kernel.
# Works in a private run dir under a unique prefix; removes everything at
# the end, also on Ctrl-C. Prints up, convergence and teardown times and
# the BIRD processes' mean and total resident memory.
set -euo pipefail
bin="" hello=1
while getopts "b:H:" o; do
	case $o in
	b) bin=$OPTARG ;;
	H) hello=$OPTARG ;;
	*) sed -n '2,13p' "$0" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -ge 2 ] || { sed -n '2,13p' "$0" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "ospf-converge: needs root" >&2; exit 2; }
command -v bird >/dev/null || { echo "ospf-converge: needs bird (apt-get install bird2)" >&2; exit 2; }
work=$(mktemp -d /tmp/nsfleet-ospf.XXXXXX)
if [ -z "$bin" ]; then
	bin=$work/nsfleet
	(cd "$(dirname "$0")/.." && go build -o "$bin" ./cmd/nsfleet)
fi
prefix="o$$-"
spec=$work/spec.yaml
nsf() { "$bin" --run-dir "$work/netns" "$@"; }
cleanup() {
	nsf down -f "$spec" --grace 2s --progress none >/dev/null 2>&1 || true
	umount -l "$work/netns" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
"$bin" topo "$@" --prefix "$prefix" --no-ipv6 --bird "$hello" >"$spec"
echo "ospf-converge: $(head -1 "$spec" | sed 's/^# nsfleet topo: //')"
t0=$(date +%s.%N)
nsf up -f "$spec" --progress none
t1=$(date +%s.%N)
nsf topo wait -f "$spec" --timeout 30m
t2=$(date +%s.%N)
rss=$(ps -C bird -o rss=,args= | grep -F -- "$work/.nsfleet-netns/" | awk '{s += $1; n++} END {printf "%d processes, mean %.1f MiB, total %.0f MiB", n, s / n / 1024, s / 1024}')
nsf down -f "$spec" --grace 2s --progress none | tail -1
t3=$(date +%s.%N)
awk -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" -v rss="$rss" 'BEGIN {
	printf "ospf-converge: up %.1f s, converged %.1f s after up (%.1f s from the start), down %.1f s; BIRD: %s\n", b - a, c - b, c - a, d - c, rss }'
