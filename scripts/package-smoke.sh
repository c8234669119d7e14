#!/usr/bin/env bash
# Builds the Debian package, installs it with apt, uses the installed
# binaries as an operator would (version, doctor, up and down of the
# packaged example of 3,000 routers in a private run dir, completion of a namespace name,
# man page and unit present), then removes the package and checks that
# nothing of it is left. Refuses to run where nsfleet is already installed
# as a package (it would replace and remove it).
#   scripts/package-smoke.sh
set -euo pipefail
cd "$(dirname "$0")/.."
[ -r /usr/share/bash-completion/bash_completion ] || { echo "package-smoke: needs bash-completion" >&2; exit 1; }
if dpkg-query -W -f='${Status}' nsfleet 2>/dev/null | grep -q 'install ok'; then
	echo "package-smoke: the nsfleet package is installed here already; not touching it" >&2
	exit 1
fi
work=$(mktemp -d /tmp/nsfleet-pkg.XXXXXX)
installed=0
cleanup() {
	if [ -x /usr/bin/nsfleet ] && [ -d "$work/netns" ]; then
		/usr/bin/nsfleet --run-dir "$work/netns" down --prefix bar- --progress none >/dev/null 2>&1 || true
	fi
	[ "$installed" = 1 ] && DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq nsfleet >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT INT TERM
fail() { echo "package-smoke: $*" >&2; exit 1; }

bash scripts/package.sh -o "$work/dist"
deb=$(ls "$work"/dist/nsfleet_*_amd64.deb)
dpkg-deb -c "$deb" | awk '{print $6}' >"$work/contents"
for f in ./usr/bin/nsfleet ./usr/bin/nsfleet-cluster ./usr/bin/nsfleet-lab ./lib/systemd/system/nsfleet-agent.service ./etc/default/nsfleet-agent \
	./usr/share/bash-completion/completions/nsfleet ./usr/share/zsh/vendor-completions/_nsfleet ./usr/share/fish/vendor_completions.d/nsfleet.fish \
	./usr/share/man/man1/nsfleet.1.gz ./usr/share/man/man1/nsfleet-up.1.gz ./usr/share/man/man1/nsfleet-cluster-apply.1.gz \
	./usr/share/doc/nsfleet/README.md ./usr/share/doc/nsfleet/examples/fake-routers.yaml \
	./usr/share/nsfleet/grafana/nsfleet.json ./usr/share/nsfleet/prometheus/nsfleet-rules.yml; do
	grep -qxF "$f" "$work/contents" || fail "the package lacks $f"
done

echo "package-smoke: apt install $deb"
installed=1
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$deb" >/dev/null
/usr/bin/nsfleet version
/usr/bin/nsfleet version -o json | grep -q '"commit"' || fail "nsfleet version names no commit"
/usr/bin/nsfleet version -o json | grep -q '"linking": "static"' || fail "nsfleet is not static"
/usr/bin/nsfleet-cluster version >/dev/null
/usr/bin/nsfleet-lab version >/dev/null
rc=0; /usr/bin/nsfleet doctor >"$work/doctor.txt" 2>&1 || rc=$?
[ "$rc" -le 2 ] && grep -q . "$work/doctor.txt" || fail "doctor: exit $rc: $(cat "$work/doctor.txt")"
echo "package-smoke: doctor ran (exit $rc)"

# The packaged example as it is (3,000 fake routers), in a private run dir.
ex=/usr/share/doc/nsfleet/examples/fake-routers.yaml
/usr/bin/nsfleet --run-dir "$work/netns" up -f "$ex" --progress none
# In the kernel, not only in nsfleet's own view: 3,000 pins, their host
# veths, and a router's forwarding and peer end seen by ip(8).
[ "$(ls "$work/netns" | wc -l)" = 3000 ] || fail "up: not 3000 pins"
[ "$(ip -o link show type veth | grep -c ': q[rg]o-[0-9]*@')" = 6000 ] || fail "up: not 6000 host veths"
[ "$(/usr/bin/nsfleet --run-dir "$work/netns" exec bar-1234 -- ip -o link show qri-1234 2>/dev/null | grep -c 'qri-1234@')" = 1 ] || fail "bar-1234 has no qri-1234"
[ "$(/usr/bin/nsfleet --run-dir "$work/netns" exec bar-1234 -- cat /proc/sys/net/ipv4/ip_forward)" = 1 ] || fail "bar-1234: ip_forward is not 1"
[ "$(/usr/bin/nsfleet --run-dir "$work/netns" ls -f "$ex" -o json | grep -c '"state": "ok"')" = 3000 ] || fail "ls after up: not 3000 ok"
# The installed completion completes a namespace name from the run dir.
got=$(bash -c 'source /usr/share/bash-completion/bash_completion
	source /usr/share/bash-completion/completions/nsfleet
	COMP_WORDS=(nsfleet --run-dir '"$work/netns"' exec bar-29); COMP_CWORD=4
	COMP_LINE="${COMP_WORDS[*]}"; COMP_POINT=${#COMP_LINE}; COMP_TYPE=9
	__start_nsfleet nsfleet bar-29 exec 2>/dev/null; echo "${COMPREPLY[*]}"')
case " $got " in *" bar-299 "*) ;; *) fail "completion of bar-29: '$got'" ;; esac
/usr/bin/nsfleet --run-dir "$work/netns" down -f "$ex" --progress none
[ -z "$(ls "$work/netns" 2>/dev/null)" ] || fail "down left pins"
[ "$(ip -o link show type veth | grep -c ': q[rg]o-[0-9]*@')" = 0 ] || fail "down left host veths"

if [ -d /run/systemd/system ]; then
	systemctl cat nsfleet-agent >/dev/null || fail "systemctl cat nsfleet-agent"
fi
grep -q '^ExecStart=/usr/bin/nsfleet-cluster agent' /lib/systemd/system/nsfleet-agent.service || fail "unit"

echo "package-smoke: apt remove"
DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq nsfleet >/dev/null
for f in /usr/bin/nsfleet /usr/bin/nsfleet-cluster /usr/bin/nsfleet-lab /lib/systemd/system/nsfleet-agent.service /usr/share/bash-completion/completions/nsfleet; do
	[ ! -e "$f" ] || fail "$f is left after apt remove"
done
DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq nsfleet >/dev/null
installed=0
[ ! -e /etc/default/nsfleet-agent ] || fail "/etc/default/nsfleet-agent is left after purge"
echo "package-smoke: ok"
