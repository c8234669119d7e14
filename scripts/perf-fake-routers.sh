#!/usr/bin/env bash
# Reproduces the numbers in docs/PERFORMANCE.md for the fake-router workload:
# the original ip(8) script (baseline) and nsfleet, in the same run.
#
#   scripts/perf-fake-routers.sh [NSFLEET_COUNT] [IP_COUNT] [RSS_COUNT]
#
# Defaults: 5000 routers with nsfleet, 200 with the ip script (it runs at
# ~25 routers/s), and no RSS run (give e.g. 20000 to measure peak RSS).
# Names start with "perf-"; everything made is deleted at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-5000}
nip=${2:-200}
nrss=${3:-0}
export PATH="/usr/local/go/bin:$PATH"
bin=$(mktemp -d)/nsfleet
go build -o "$bin" ./cmd/nsfleet
spec=$(mktemp --suffix=.yaml)
trap 'rm -f "$spec"; "$bin" down --prefix perf- --progress none >/dev/null 2>&1 || true' EXIT

mkspec() {
	sed "s/count: 3000/count: $1/; s/\"bar-{i}\"/\"perf-{i}\"/; s/\"qro-{i}\"/\"pfo{i}\"/; s/\"qgo-{i}\"/\"pfg{i}\"/" \
		examples/fake-routers.yaml >"$spec"
}

echo "== machine: $(uname -r), $(nproc) CPUs, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
echo "== run dir: $(findmnt -no FSTYPE -T /run/netns 2>/dev/null || findmnt -no FSTYPE -T /run)"
echo
echo "== baseline: the 2014 ip script, $nip routers"
scripts/fake-routers-ip.sh "$nip" perfip 50
echo
echo "== nsfleet up, $n routers (examples/fake-routers.yaml with count $n)"
mkspec "$n"
/usr/bin/time -f "up: %e s wall, %M KiB max RSS" "$bin" up -f "$spec" --marks --progress none
echo
echo "== nsfleet up again (nothing to do)"
"$bin" up -f "$spec" --progress none
echo
echo "== nsfleet down, waiting for the kernel"
/usr/bin/time -f "down: %e s wall, %M KiB max RSS" "$bin" down -f "$spec" --progress none
if [ "$nrss" -gt 0 ]; then
	echo
	echo "== nsfleet up, $nrss routers, peak RSS"
	mkspec "$nrss"
	/usr/bin/time -f "up: %e s wall, %M KiB max RSS" "$bin" up -f "$spec" --progress none
	/usr/bin/time -f "down: %e s wall, %M KiB max RSS" "$bin" down -f "$spec" --progress none
fi
