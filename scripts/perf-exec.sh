#!/usr/bin/env bash
# Reproduces the exec numbers of docs/PERFORMANCE.md: with N
# namespaces pinned in /run/netns, the time of
#   true                               (a plain fork+exec)
#   setns-exec PIN true                (scripts/setns-exec.c: the floor for a wrapper)
#   nsfleet exec NAME -- true          (setns only: the C fast path)
#   nsfleet exec NAME true             (the same, typed as ip netns exec is)
#   nsfleet-static exec NAME -- true   (a static build: no dynamic loader)
#   nsfleet exec --mount-ns NAME true  (a mount namespace, as ip does)
#   ip netns exec NAME true
# measured side by side by hyperfine (Debian package), as root:
#
#   scripts/perf-exec.sh [N] [RUNS]      defaults: 20000 namespaces, 200 runs
#
# Namespaces are named pex-N; everything is deleted at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
n=${1:-20000}
runs=${2:-200}
export PATH="/usr/local/go/bin:$PATH"
command -v hyperfine >/dev/null || { apt-get update -qq && apt-get install -y -qq hyperfine; }
tmp=$(mktemp -d)
bin=$tmp/nsfleet
go build -o "$bin" ./cmd/nsfleet
# Pure-Go user and DNS lookups (osusergo, netgo) let the static link go
# without glibc's NSS warnings.
go build -tags osusergo,netgo -ldflags '-extldflags=-static' -o "$tmp/nsfleet-static" ./cmd/nsfleet
gcc -O2 -static -o "$tmp/setns-exec" scripts/setns-exec.c
spec=$(mktemp --suffix=.yaml)
trap 'rm -f "$spec"; "$bin" down --prefix pex- --progress none >/dev/null 2>&1 || true' EXIT
printf 'namespaces:\n  - name: "pex-{i}"\n    count: %d\n' "$n" >"$spec"
echo "== $(uname -r), $(nproc) CPUs; $n namespaces in /run/netns; $(wc -l </proc/self/mountinfo) mounts"
"$bin" up -f "$spec" --progress none
name="pex-$((n / 2))"
hyperfine -N --warmup 10 --runs "$runs" --style basic --export-json "$tmp/h.json" \
	"true" \
	"$tmp/setns-exec /run/netns/$name true" \
	"$bin exec $name -- true" \
	"$bin exec $name true" \
	"$tmp/nsfleet-static exec $name -- true" \
	"$bin exec --mount-ns $name -- true" \
	"ip netns exec $name true" >/dev/null
python3 - "$tmp/h.json" <<'PY'
import json, sys
res = json.load(open(sys.argv[1]))["results"]
base, wrapper = res[0]["median"], res[1]["median"]
print("| command | median | mean ± sd | vs true | vs setns-exec |")
print("|---|---|---|---|---|")
for r in res:
    cmd = r["command"].replace(sys.argv[1].rsplit("/", 1)[0] + "/", "")
    print(f"| `{cmd}` | {r['median']*1e3:.2f} ms | {r['mean']*1e3:.2f} ± {r['stddev']*1e3:.2f} ms | {r['median']/base:.2f}x | {r['median']/wrapper:.2f}x |")
PY
