#!/usr/bin/env bash
# Fault campaign: a 3-node sim serving N routers with host veths up, random
# faults for a while (kill a node and add one, partition and heal, pause an
# agent, stop one or two etcd members, restart an agent or a member), each
# node's kernel sampled every 100 ms (docs/RELIABILITY.md).
#
#   scripts/fault-campaign.sh [-d DURATION] [-n ROUTERS] [-s SEED] [-t TTL] [-p] [-o OUT]
#
# -p plants one violation (a router's host veth up by hand on a second
# node for 3 s): the run then succeeds only if the checker reports it and
# nothing else. -o keeps the report (text), the timeline (OUT.trace) and
# the agents' logs (OUT.logs/). Builds nsfleet and nsfleet-cluster, makes
# the sim in a temporary directory and removes it at the end, also on
# Ctrl-C or failure. Exits non-zero on any violation.
set -euo pipefail

duration=3m routers=300 seed=$$ ttl=5s plant="" out=""
while getopts "d:n:s:t:po:" o; do
	case $o in
	d) duration=$OPTARG ;;
	n) routers=$OPTARG ;;
	s) seed=$OPTARG ;;
	t) ttl=$OPTARG ;;
	p) plant=--plant ;;
	o) out=$OPTARG ;;
	*) sed -n '2,15p' "$0" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" = 0 ] || { echo "fault-campaign: needs root" >&2; exit 2; }

work=$(mktemp -d /tmp/nsfleet-faults.XXXXXX)
sim=$work/sim
cleanup() {
	if [ -n "$out" ] && [ -d "$sim/nodes" ]; then
		mkdir -p "$out.logs"
		for n in "$sim"/nodes/*; do
			cp "$n/agent.log" "$out.logs/$(basename "$n").log" 2>/dev/null || true
		done
	fi
	"$work/nsfleet" sim down --dir "$sim" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

(cd "$(dirname "$0")/.." && go build -o "$work/" ./cmd/nsfleet ./cmd/nsfleet-cluster)
export PATH="$work:$PATH"

prefix="f$((seed % 10000))-"
spec=$work/routers.yaml
cat >"$spec" <<EOF
namespaces:
  - name: "${prefix}r-{i}"
    count: $routers
    sysctls:
      net.ipv4.ip_forward: "1"
    veths:
      - host: "${prefix}h{i}"
        peer: qr
        up: true
        host_ipv6: false
        peer_addresses: ["10.{i/250}.{i%250}.1/24"]
EOF

nsfleet sim up --nodes 3 --dir "$sim" --lease-ttl "$ttl" >/dev/null
export $(cat "$sim/etcd.env")
nsfleet cluster apply -f "$spec" >/dev/null
for _ in $(seq 1 300); do
	if nsfleet cluster status -o json | grep -q "\"ready\": $routers,"; then
		break
	fi
	sleep 0.2
done

args=(sim campaign --dir "$sim" --duration "$duration" --seed "$seed" $plant)
[ -n "$out" ] && args+=(--trace "$out.trace")
status=0
if [ -n "$out" ]; then
	nsfleet "${args[@]}" | tee "$out" || status=$?
else
	nsfleet "${args[@]}" || status=$?
fi
exit "$status"
