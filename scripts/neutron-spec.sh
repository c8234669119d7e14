#!/usr/bin/env bash
# Writes a Neutron-shaped spec of N routers to stdout, as a real gateway's
# fleet is: one template per router (no {i}), each with its own name, its
# own tenant subnet on the qr- pair and its own external address on the qg-
# pair, both up without IPv6 on the host end, a default route and
# forwarding on. With -t it writes the templated spec of the same shape
# (one template, count N) instead, the baseline heterogeneous fleets are
# measured against (docs/PERFORMANCE.md).
#
#   scripts/neutron-spec.sh [-t] [-p PREFIX] N > routers.yaml
set -euo pipefail

templated=0 prefix=""
while getopts "tp:" o; do
	case $o in
	t) templated=1 ;;
	p) prefix=$OPTARG ;;
	*) sed -n '2,11p' "$0" >&2; exit 2 ;;
	esac
done
shift $((OPTIND - 1))
n=${1:?usage: neutron-spec.sh [-t] [-p PREFIX] N}
[ "$n" -ge 1 ] && [ "$n" -le 65000 ] || { echo "neutron-spec: N from 1 to 65000" >&2; exit 2; }

echo "namespaces:"
if [ "$templated" = 1 ]; then
	cat <<EOF
  - name: "${prefix}qrouter-{i}"
    count: $n
    sysctls:
      net.ipv4.ip_forward: "1"
    veths:
      - host: "${prefix}qr{i}"
        peer: "qr-in"
        up: true
        host_ipv6: false
        host_addresses: ["10.{i/256}.{i%256}.1/30"]
        peer_addresses: ["10.{i/256}.{i%256}.2/30"]
      - host: "${prefix}qg{i}"
        peer: "qg-in"
        up: true
        host_ipv6: false
        peer_addresses: ["100.{i/65536+64}.{i/256%256}.{i%256}/10"]
    routes:
      - to: default
        via: 100.64.0.1
EOF
	exit 0
fi
# awk, not a shell loop: 40,000 routers in a second.
awk -v n="$n" -v p="$prefix" 'BEGIN {
	for (i = 1; i <= n; i++) {
		a = int(i / 256); b = i % 256
		printf "  - name: \"%sqrouter-%08x-%04x-4%03x-8%03x-%012x\"\n", p, i * 2654435761 % 4294967296, i % 65536, i % 4096, (i * 7) % 4096, i
		printf "    sysctls:\n      net.ipv4.ip_forward: \"1\"\n"
		printf "    veths:\n"
		printf "      - host: \"%sqr%d\"\n        peer: \"qr-in\"\n        up: true\n        host_ipv6: false\n", p, i
		printf "        host_addresses: [\"10.%d.%d.1/30\"]\n        peer_addresses: [\"10.%d.%d.2/30\"]\n", a, b, a, b
		printf "      - host: \"%sqg%d\"\n        peer: \"qg-in\"\n        up: true\n        host_ipv6: false\n", p, i
		printf "        peer_addresses: [\"100.%d.%d.%d/10\"]\n", 64 + int(i / 65536), a % 256, b
		printf "    routes:\n      - to: default\n        via: 100.64.0.1\n"
	}
}'
