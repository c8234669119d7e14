#!/usr/bin/env bash
# Compare `ls -f SPEC -o json` of several nsfleet binaries on one fleet
# (docs/PERFORMANCE.md, "The first ls after up").
#
#   scripts/ls-compare.sh [-n N] [-r ROUNDS] BIN...
#
# Makes N fake routers (default 20000) in a private run dir with the first
# binary, then, ROUNDS times (default 5), runs each binary's `ls` twice:
# "cold" right after dropping the kernel's reclaimable caches (`echo 2 >
# /proc/sys/vm/drop_caches`: the dentries and inodes sysfs and procfs had
# made, as right after `up`), then "warm". Binaries alternate, so that the
# machine's drift hits them alike. Prints the median and smallest wall
# time and the median CPU time (user + system) of each binary and case,
# and checks that every binary printed the same JSON. The fleet is removed
# at the end, also on Ctrl-C.
set -euo pipefail
n=20000 rounds=5
while getopts "n:r:" o; do
	case $o in
	n) n=$OPTARG ;;
	r) rounds=$OPTARG ;;
	*) sed -n '2,14p' "$0" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
[ $# -ge 1 ] || { sed -n '2,14p' "$0" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "ls-compare: needs root" >&2; exit 2; }
work=$(mktemp -d /tmp/nsfleet-lscmp.XXXXXX)
bins=()
for b in "$@"; do
	mkdir -p "$work/${#bins[@]}"
	cp "$b" "$work/${#bins[@]}/$(basename "$b")" # measured from copies, as scale.sh
	bins+=("$work/${#bins[@]}/$(basename "$b")")
done
prefix="c$(($$ % 1000))-"
rundir=$work/netns
spec=$work/spec.yaml
. "$(dirname "$0")/fake-router-spec.sh"
fake_router_spec "$prefix" $n >"$spec"
cleanup() {
	"${bins[0]}" --run-dir "$rundir" down -f "$spec" --progress none >/dev/null 2>&1 || true
	umount -l "$rundir" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT
"${bins[0]}" --run-dir "$rundir" up -f "$spec" --progress none >/dev/null
for r in $(seq "$rounds"); do
	for i in "${!bins[@]}"; do
		for c in cold warm; do
			[ $c = warm ] || { sync; echo 2 >/proc/sys/vm/drop_caches; }
			/usr/bin/time -f "$i $c %e %U %S" -a -o "$work/times" \
				"${bins[$i]}" --run-dir "$rundir" ls -f "$spec" -o json >"$work/out.$i"
		done
		cmp -s "$work/out.0" "$work/out.$i" || echo "ls-compare: $(basename "${bins[$i]}") printed other JSON than $(basename "${bins[0]}")" >&2
	done
done
names=$(for b in "${bins[@]}"; do basename "$b"; done | paste -sd,)
python3 - "$work/times" "$n" "$names" <<'EOF'
import statistics as st, sys
names = sys.argv[3].split(",")
runs = {}
for line in open(sys.argv[1]):
    i, case, wall, user, sys_ = line.split()
    runs.setdefault((int(i), case), []).append((float(wall), float(user) + float(sys_)))
for (i, case), v in sorted(runs.items()):
    walls = [w for w, _ in v]
    print(f"{names[i]:>12} n={sys.argv[2]} {case}: wall median {st.median(walls):.2f} s, min {min(walls):.2f} s; cpu median {st.median(c for _, c in v):.2f} s  (walls {' '.join(f'{w:.2f}' for w in walls)})")
EOF
