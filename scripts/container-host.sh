#!/usr/bin/env bash
# Runs a command on a "container host" profile, then puts the host back as
# it was, also on failure or Ctrl-C:
#   - net.ipv4.ip_forward=1, net.core.devconf_inherit_init_net=${DEVCONF:-1},
#     net.ipv4.conf.all.rp_filter=2 and .default.rp_filter=1;
#   - TMPDIR on a tmpfs of its own (temporary run dirs on tmpfs);
#   - a namespace of "another tool" in /run/netns (made with ip netns add).
#
#   scripts/container-host.sh CMD [ARGS...]
#
# Exits with CMD's status.
set -uo pipefail
[ "$(id -u)" = 0 ] || { echo "container-host: needs root" >&2; exit 2; }
keys=(net.ipv4.ip_forward net.core.devconf_inherit_init_net net.ipv4.conf.all.rp_filter net.ipv4.conf.default.rp_filter)
saved=()
for k in "${keys[@]}"; do saved+=("$k=$(sysctl -n "$k")"); done
had_runnetns=no; [ -d /run/netns ] && had_runnetns=yes
was_mount=no; mountpoint -q /run/netns 2>/dev/null && was_mount=yes
had_lock=no; [ -e /run/.netns.nsfleet.lock ] && had_lock=yes
foreign="nsfleet-foreign-$$"
tmp=$(mktemp -d)
restore() {
	for kv in "${saved[@]}"; do sysctl -qw "$kv" || true; done
	ip netns del "$foreign" 2>/dev/null || true
	if [ "$was_mount" = no ]; then
		while mountpoint -q /run/netns 2>/dev/null; do umount /run/netns || break; done
	fi
	if [ "$had_runnetns" = no ]; then rmdir /run/netns 2>/dev/null || true; fi
	# Tests that used /run/netns left nsfleet's lock beside it (the foreign
	# namespace kept them from tidying up).
	if [ "$had_lock" = no ]; then rm -f /run/.netns.nsfleet.lock; fi
	umount "$tmp" 2>/dev/null || true
	rmdir "$tmp" 2>/dev/null || true
}
trap restore EXIT
trap 'exit 130' INT TERM
sysctl -qw net.ipv4.ip_forward=1 "net.core.devconf_inherit_init_net=${DEVCONF:-1}" net.ipv4.conf.all.rp_filter=2 net.ipv4.conf.default.rp_filter=1
ip netns add "$foreign"
mount -t tmpfs -o mode=1777 nsfleet-container-host-tmp "$tmp"
TMPDIR=$tmp "$@"
