#!/usr/bin/env bash
# Flakiness check: the whole suite K times in a row under CPU load
# (stress-ng, one hog per CPU), then K times on the container-host profile
# (scripts/container-host.sh). Stops at the first failure.
#
#   scripts/suite-under-load.sh [K]      default 5
set -euo pipefail
k=${1:-5}
cd "$(dirname "$0")/.."
export PATH="/usr/local/go/bin:$PATH"
command -v stress-ng >/dev/null || { apt-get update -qq && apt-get install -y -qq stress-ng; }
hog=""
trap '[ -n "$hog" ] && kill "$hog" 2>/dev/null; true' EXIT
for ((i = 1; i <= k; i++)); do
	stress-ng --cpu "$(nproc)" --timeout 1h --quiet &
	hog=$!
	start=$(date +%s)
	go test -count=1 ./... >/tmp/suite-load-$i.log 2>&1 || { echo "under load, run $i: FAILED (see /tmp/suite-load-$i.log)"; exit 1; }
	kill "$hog"; wait "$hog" 2>/dev/null || true; hog=""
	echo "under load, run $i: ok in $(($(date +%s) - start)) s"
done
for ((i = 1; i <= k; i++)); do
	start=$(date +%s)
	DEVCONF=$(( (i % 3) )) bash scripts/container-host.sh go test -count=1 ./... >/tmp/suite-host-$i.log 2>&1 || { echo "container host, run $i: FAILED (see /tmp/suite-host-$i.log)"; exit 1; }
	echo "container host (devconf_inherit_init_net=$((i % 3))), run $i: ok in $(($(date +%s) - start)) s"
done
echo "suite-under-load: $k runs under load and $k on the container-host profile passed"
