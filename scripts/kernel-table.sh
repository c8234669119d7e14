#!/usr/bin/env bash
# The lab's kernel table: fake-router, churn and uevent on this machine's
# kernel (natively) beside Debian's newest 6.1 generic, cloud and rt
# kernels (each booted in a VM; TCG where KVM cannot boot them), one run per
# scenario with the kernels as columns, stored in the results database.
#   scripts/kernel-table.sh [-d CACHE] [-b NSFLEET-LAB] [--db FILE] [-r RUNS]
# The kernels are downloaded (apt-get download, unpacked, not installed)
# into CACHE (default /var/cache/nsfleet-kernels). Under TCG everything runs
# about ten times slower, hence the small -n.
set -euo pipefail
cache=/var/cache/nsfleet-kernels bin="" db="" runs=3
while [ $# -gt 0 ]; do
	case $1 in
	-d) cache=$2; shift 2 ;;
	-b) bin=$2; shift 2 ;;
	--db) db=$2; shift 2 ;;
	-r) runs=$2; shift 2 ;;
	*) echo "usage: $0 [-d CACHE] [-b NSFLEET] [--db FILE] [-r RUNS]" >&2; exit 2 ;;
	esac
done
cd "$(dirname "$0")/.."
if [ -z "$bin" ]; then
	bin=$(mktemp -d /tmp/nsfleet-kt.XXXXXX)/nsfleet-lab
	PATH=/usr/local/go/bin:$PATH go build -o "$bin" ./cmd/nsfleet-lab
fi
mkdir -p "$cache/all/lib/modules"
images=()
for flavour in amd64 cloud-amd64 rt-amd64; do
	pkg=$(apt-cache search --names-only "^linux-image-6\.1\.0-[0-9]+-$flavour-unsigned\$" | awk '{print $1}' | sort -V | tail -1)
	[ -n "$pkg" ] || { echo "kernel-table: no Debian 6.1 $flavour kernel in apt's lists (apt-get update?)" >&2; exit 1; }
	rel=${pkg#linux-image-}; rel=${rel%-unsigned}
	if [ ! -e "$cache/$flavour/boot/vmlinuz-$rel" ]; then
		echo "kernel-table: fetching $pkg"
		rm -rf "$cache/$flavour" && mkdir -p "$cache/$flavour"
		(cd "$cache/$flavour" && apt-get download -qq "$pkg" 2>/dev/null && dpkg-deb -x ./*.deb . && rm -f ./*.deb)
		rm -rf "$cache/all/lib/modules/$rel"
		mv "$cache/$flavour/lib/modules/$rel" "$cache/all/lib/modules/"
	fi
	images+=("$cache/$flavour/boot/vmlinuz-$rel")
done
kernels="host,$(IFS=,; echo "${images[*]}")"
common=(--kernel "$kernels" --modules "$cache/all" --progress plain --runs "$runs")
[ -n "$db" ] && common+=(--db "$db")
set -x
"$bin" bench fake-router -n 300 --mark 100 --engines native --variants add,add+2exec+2link "${common[@]}"
"$bin" bench churn -n 2000 --mark 1000 --variants net "${common[@]}"
"$bin" bench uevent -n 2000 --mark 2000 --variants listeners,no-listeners "${common[@]}"
