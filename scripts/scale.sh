#!/usr/bin/env bash
# Scale check: how nsfleet's commands grow with the fleet, against a bulk
# unpin baseline in the same run (docs/PERFORMANCE.md, "Large fleets").
#
#   scripts/scale.sh [-b NSFLEET]... [-n N]
#
# For each binary (default: one built from this checkout), on N fake
# routers (default 5000) in a private run dir: `up` (wall, peak RSS), `ls -f
# SPEC -o json`, a second `up` with nothing to change, `down` (until the
# kernel has freed everything; its exit code), and then, on the same fleet
# made again, the baseline: every pin unmounted and unlinked by
# scripts/bulk-unpin.c, then waiting until the host veths are gone. Prints
# one line per binary and step: seconds, peak RSS in MiB, exit code.
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
	go build -o "$work/nsfleet" ./cmd/nsfleet
	bins=("$work/nsfleet")
fi
gcc -O2 -o "$work/bulk-unpin" scripts/bulk-unpin.c
prefix="s$(($$ % 1000))-"
rundir=$work/netns
spec=$work/spec.yaml
cat >"$spec" <<EOF
namespaces:
  - name: "${prefix}bar-{i}"
    count: $n
    sysctls:
      net.ipv4.ip_forward: "1"
    veths:
      - host: "${prefix}o{i}"
        peer: "qri-{i}"
      - host: "${prefix}g{i}"
        peer: "qgi-{i}"
EOF
cleanup() {
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

host_veths() { ip -o link show 2>/dev/null | grep -c "${prefix}[og][0-9]*@" || true; }

for bin in "${bins[@]}"; do
	label=$(basename "$bin")
	step up "$bin" --run-dir "$rundir" up -f "$spec" --progress none
	step ls "$bin" --run-dir "$rundir" ls -f "$spec" -o json
	step up-again "$bin" --run-dir "$rundir" up -f "$spec" --progress none
	step down "$bin" --run-dir "$rundir" down -f "$spec" --progress none --timeout 10m
done

# The baseline: the same fleet, removed by unmount and unlink, then waited
# for until the last host veth is gone (the kernel's own pace).
label=baseline
"${bins[0]}" --run-dir "$rundir" up -f "$spec" --progress none >/dev/null
wait_gone() { while [ "$(host_veths)" != 0 ]; do sleep 0.1; done; }
step unpin+wait bash -c "'$work/bulk-unpin' '$rundir' && $(declare -f host_veths wait_gone); prefix='$prefix' wait_gone"
