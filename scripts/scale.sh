#!/usr/bin/env bash
# Scale check: how nsfleet's commands grow with the fleet, against a bulk
# unpin baseline in the same run (docs/PERFORMANCE.md, "Large fleets").
#
#   scripts/scale.sh [-b NSFLEET]... [-n N]
#
# For each binary (default: one built from this checkout), on N fake
# routers (default 5000) in a private run dir: `up` (wall, peak RSS), `ls -f
# SPEC -o json`, a second `up` with nothing to change, `down` (until the
# kernel has freed everything; its exit code; when its veths were gone),
# and then, on the same fleet made again, the baseline: every pin
# unmounted and unlinked by scripts/bulk-unpin.c, then waiting until the
# host veths are gone and until the namespaces are freed. The baseline
# runs twice: on a fleet fresh from `up`, and on one that went through the
# same `ls` as the binaries' fleets, the first binary's (a read that
# describes a namespace's veths over rtnetlink gives it an id for the
# host, and every such id makes the kernel's teardown dearer; nsfleet's
# reads no longer do: docs/PERFORMANCE.md). Prints one line per binary and
# step: seconds, peak RSS in MiB, exit code.
# Everything made is removed at the end, also on Ctrl-C.
set -euo pipefail
n=5000 bins=()
while getopts "b:n:" o; do
	case $o in
	b) bins+=("$OPTARG") ;;
	n) n=$OPTARG ;;
	*) sed -n '2,15p' "$0" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" = 0 ] || { echo "scale: needs root" >&2; exit 2; }
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
work=$(mktemp -d /tmp/nsfleet-scale.XXXXXX)
if [ ${#bins[@]} = 0 ]; then
	go build -o "$work/build/nsfleet" ./cmd/nsfleet
	bins=("$work/build/nsfleet")
fi
# Every binary is measured from a copy made here: how a file was written
# decides the page-cache folios its text is mapped from, and a binary
# fresh from the linker counted 10 MiB more peak RSS than a copy of it
# (docs/PERFORMANCE.md).
for i in "${!bins[@]}"; do
	mkdir -p "$work/$i"
	cp "${bins[$i]}" "$work/$i/$(basename "${bins[$i]}")"
	bins[$i]=$work/$i/$(basename "${bins[$i]}")
done
gcc -O2 -o "$work/bulk-unpin" scripts/bulk-unpin.c
prefix="s$(($$ % 1000))-"
rundir=$work/netns
spec=$work/spec.yaml
. scripts/fake-router-spec.sh # (the cd above: paths from the repository root)
fake_router_spec "$prefix" $n >"$spec"
spids=()
cleanup() {
	for p in "${spids[@]}"; do kill "$p" 2>/dev/null || true; done
	"${bins[0]}" --run-dir "$rundir" down -f "$spec" --progress none >/dev/null 2>&1 || true
	umount -l "$rundir" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

# step NAME CMD...: run it, print seconds, peak RSS and exit code.
step() {
	local name=$1 rc=0
	shift
	/usr/bin/time -f "%e %M" -o "$work/time" "$@" >"$work/out" 2>&1 || rc=$?
	read -r secs kb <"$work/time" || true
	printf '%-10s %-8s n=%-6s %8.2f s  %6.1f MiB  exit %d\n' "$label" "$name" "$n" "${secs:-0}" "$(echo "${kb:-0} / 1024" | bc -l)" "$rc"
}

# Host veths of this run, from sysfs: a dump of the host's links over
# rtnetlink would itself cost the kernel a scan of every namespace id per
# veth, and slow the teardown it watches.
host_veths() { ls /sys/class/net 2>/dev/null | grep -c "^${prefix}[og][0-9]" || true; }

for bin in "${bins[@]}"; do
	label=$(basename "$bin")
	step up "$bin" --run-dir "$rundir" up -f "$spec" --progress none
	step ls "$bin" --run-dir "$rundir" ls -f "$spec" -o json
	step up-again "$bin" --run-dir "$rundir" up -f "$spec" --progress none
	step down "$bin" --run-dir "$rundir" down -f "$spec" --progress none --timeout 10m
	# down's own account: when the host veths were gone, when freed.
	sed -n 's/^down: kernel finished in .*: \(.*\)$/           (down: \1)/p' "$work/out"
done

# The baseline: the same fleet, removed by unmount and unlink, then waited
# for as down waits: until the last host veth is gone, and until the kernel
# has freed the namespaces, proved as down proves it: two sentinel
# namespaces (held by a sleep of ours, with a veth to the host) released
# one after the other; the kernel frees namespaces in order, so once the
# second sentinel's veth is gone, every pin's namespace is freed.
sentinel() {
	unshare -n sleep 100000 &
	local pid=$! self
	self=$(readlink /proc/self/ns/net)
	while [ "$(readlink /proc/$pid/ns/net 2>/dev/null)" = "$self" ]; do sleep 0.01; done
	ip link add "${prefix}k$1" type veth peer name p netns "$pid"
	spids+=("$pid")
}
# baseline LABEL: make the fleet, run the commands given, tear it down.
baseline() {
	local label=$1
	shift
	"${bins[0]}" --run-dir "$rundir" up -f "$spec" --progress none >/dev/null
	"$@"
	spids=()
	sentinel 0
	sentinel 1
	t0=$(date +%s.%N)
	"$work/bulk-unpin" "$rundir"
	while [ "$(host_veths)" != 0 ]; do sleep 0.1; done
	t1=$(date +%s.%N)
	for k in 0 1; do
		kill "${spids[$k]}"
		wait "${spids[$k]}" 2>/dev/null || true
		while [ -e "/sys/class/net/${prefix}k$k" ]; do sleep 0.01; done
	done
	t2=$(date +%s.%N)
	printf '%-10s %-8s n=%-6s %8.2f s  (unpin, host veths gone)\n' "$label" unpin "$n" "$(echo "$t1 - $t0" | bc)"
	printf '%-10s %-8s n=%-6s %8.2f s  (unpin, namespaces freed)\n' "$label" unpin "$n" "$(echo "$t2 - $t0" | bc)"
}
ls_fleet() { "${bins[0]}" --run-dir "$rundir" ls -f "$spec" -o json >/dev/null; }
baseline baseline true
baseline base+ls ls_fleet
