#!/usr/bin/env bash
# The 2014 Neutron "fake router" script (docs/BACKGROUND.md, report 000), as the
# thread ran it: one ip(8) process per command. It is nsfleet's baseline.
#
#   scripts/fake-routers-ip.sh COUNT [PREFIX] [MARK]
#
# Prints the rate every MARK routers (default 250) and the overall rate,
# then deletes what it made (also on Ctrl-C). Names are PREFIX-bar-N,
# PREFIX-ro-N, ...; the uuid of the original is replaced by a counter so that
# the names fit in 15 bytes and cleanup can find them.
set -euo pipefail
count=${1:?usage: $0 COUNT [PREFIX] [MARK]}
prefix=${2:-ipb}
mark=${3:-250}
IP=${IP:-ip}

cleanup() {
	for ((j = 1; j <= count; j++)); do
		$IP netns del "$prefix-bar-$j" 2>/dev/null || true
	done
}
trap cleanup EXIT

add_fake_router() {
	local i=$1
	$IP netns add "$prefix-bar-$i"
	$IP netns exec "$prefix-bar-$i" $IP link set lo up
	$IP netns exec "$prefix-bar-$i" sysctl -w net.ipv4.ip_forward=1 >/dev/null
	$IP link add "$prefix-ro$i" type veth peer name "qri-$i" netns "$prefix-bar-$i"
	$IP link add "$prefix-go$i" type veth peer name "qgi-$i" netns "$prefix-bar-$i"
}

start=$(date +%s.%N)
last=$start
for ((i = 1; i <= count; i++)); do
	add_fake_router "$i"
	if ((i % mark == 0)); then
		now=$(date +%s.%N)
		echo "$i $(echo "$mark / ($now - $last)" | bc -l | xargs printf '%.1f') routers/s"
		last=$now
	fi
done
end=$(date +%s.%N)
echo "total: $count routers in $(echo "$end - $start" | bc -l | xargs printf '%.2f')s ($(echo "$count / ($end - $start)" | bc -l | xargs printf '%.1f') routers/s)"
