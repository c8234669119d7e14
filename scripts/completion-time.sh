#!/usr/bin/env bash
# How long bash takes to complete `nsfleet exec PREFIX<TAB>` with N real
# namespaces (in a private run dir, removed afterwards): the whole path a
# TAB takes (bash-completion, cobra's script, nsfleet __complete, the run
# dir read), best of 5.
#   scripts/completion-time.sh [-n 40000] [-b DIR_WITH_BINARIES]
set -euo pipefail
n=40000 bin=""
while getopts "n:b:" o; do
	case $o in
	n) n=$OPTARG ;;
	b) bin=$OPTARG ;;
	*) echo "usage: $0 [-n N] [-b DIR]" >&2; exit 2 ;;
	esac
done
[ -r /usr/share/bash-completion/bash_completion ] || { echo "needs bash-completion (apt install bash-completion)" >&2; exit 1; }
cd "$(dirname "$0")/.."
work=$(mktemp -d /tmp/nsfleet-completion.XXXXXX)
cleanup() {
	"$work/nsfleet" --run-dir "$work/netns" down --prefix cpl- >/dev/null 2>&1 || true
	umount "$work/netns" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT INT TERM
if [ -n "$bin" ]; then cp "$bin/nsfleet" "$work/"; else
	PATH=/usr/local/go/bin:$PATH go build -o "$work/" ./cmd/nsfleet
fi
printf 'namespaces:\n  - name: "cpl-{i}"\n    count: %d\n' "$n" >"$work/spec.yaml"
"$work/nsfleet" --run-dir "$work/netns" up -f "$work/spec.yaml" --progress none >/dev/null
"$work/nsfleet" completion bash >"$work/nsfleet.bash"
cat >"$work/tab.sh" <<EOS
source /usr/share/bash-completion/bash_completion
source $work/nsfleet.bash
PATH=$work:\$PATH
tab() {
	local best=999999 i
	for i in 1 2 3 4 5; do
		COMP_WORDS=(nsfleet --run-dir $work/netns exec "\$1"); COMP_CWORD=4
		COMP_LINE="nsfleet --run-dir $work/netns exec \$1"; COMP_POINT=\${#COMP_LINE}; COMP_TYPE=9
		local s=\$(date +%s%N)
		__start_nsfleet nsfleet "\$1" exec 2>/dev/null
		local ms=\$(( (\$(date +%s%N) - s) / 1000000 ))
		(( ms < best )) && best=\$ms
	done
	printf '%-12s %6d candidates  %4d ms\n' "\$1<TAB>" \${#COMPREPLY[@]} \$best
}
tab cpl-; tab cpl-1; tab cpl-12; tab cpl-123; tab cpl-$n
EOS
echo "nsfleet exec PREFIX<TAB> with $n namespaces (bash, best of 5):"
bash "$work/tab.sh"
