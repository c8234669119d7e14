#!/usr/bin/env bash
# Kill campaign: SIGKILL nsfleet at random moments and check that a rerun
# converges exactly (docs/RELIABILITY.md).
#
#   scripts/kill-campaign.sh [-t TRIALS] [-n ROUTERS] [-b NSFLEET] [-s SEED] [-k CMDS]
#
# -k limits the commands killed (a comma-separated list of up, down,
# supervise and exec; default all four).
#
# Each trial picks one of up, down, supervise and exec --all, starts it on a
# fleet of N fake routers (each with a supervised daemon, and joined in a
# ring by N links between them) in a private run dir, kills it with SIGKILL after a random delay within the command's
# usual duration, then runs `nsfleet up` again and checks:
#   - ls -f SPEC says every namespace is ok (its links' ends included);
#   - pins = nsfs mounts on them = N (no pin without its mount, none doubled);
#   - host veths = 2N;
#   - exactly one daemon per namespace, each matching its record (no
#     orphan process, no stale record); no exec --all command left running.
# A failed check stops the campaign and leaves the evidence in the work dir.
# Everything is removed at the end, also on Ctrl-C. Prints one line per
# trial and a summary; exits non-zero if any trial did not converge.
set -euo pipefail

trials=10 routers=200 seed=$$ bin="" kinds=up,down,supervise,exec
while getopts "t:n:b:s:k:" o; do
	case $o in
	t) trials=$OPTARG ;;
	n) routers=$OPTARG ;;
	b) bin=$OPTARG ;;
	s) seed=$OPTARG ;;
	k) kinds=$OPTARG ;;
	*) sed -n '2,24p' "$0" >&2; exit 2 ;;
	esac
done
[ "$(id -u)" = 0 ] || { echo "kill-campaign: needs root" >&2; exit 2; }
RANDOM=$seed

work=$(mktemp -d /tmp/nsfleet-kill.XXXXXX)
if [ -z "$bin" ]; then
	bin=$work/nsfleet
	(cd "$(dirname "$0")/.." && go build -o "$bin" ./cmd/nsfleet)
fi
prefix="k$((seed % 10000))-"
rundir=$work/netns
spec=$work/spec.yaml
. "$(dirname "$0")/fake-router-spec.sh"
{
	fake_router_spec "$prefix" "$routers"
	cat <<EOF
    processes:
      - name: daemon
        command: ["sleep", "100000"]
        restart: always
links:
  - a: "${prefix}bar-{i}:ra"
    b: "${prefix}bar-{i+1}:rb"
    count: $((routers - 1))
    a_addresses: ["10.{i/256}.{i%256}.0/31"]
    b_addresses: ["10.{i/256}.{i%256}.1/31"]
  - {a: "${prefix}bar-${routers}:ra", b: "${prefix}bar-1:rb"}
EOF
} >"$spec"

nsf() { "$bin" --run-dir "$rundir" "$@"; }

victim=""
cleanup() {
	[ -n "$victim" ] && kill -9 "$victim" 2>/dev/null
	nsf down -f "$spec" --grace 1s --progress none >/dev/null 2>&1 || true
	umount -l "$rundir" 2>/dev/null || true
	rm -rf "$work"
}
trap cleanup EXIT

# pins_mounts prints "PINS MOUNTS": entries in the run dir, nsfs mounts on them.
pins_mounts() {
	local pins mounts
	pins=$(find "$rundir" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)
	mounts=$(awk -v d="$rundir/" '$9 == "nsfs" && index($5, d) == 1' /proc/self/mountinfo | wc -l)
	echo "$pins $mounts"
}

# check_daemons checks that each namespace of the fleet runs exactly one
# daemon, the one its record names, and nothing else (a handful of
# processes for the whole machine, not a few per PID).
check_daemons() {
	local pins
	pins=$(stat -L -c '%i %n' "$rundir"/* 2>/dev/null | sed 's|^\([0-9]*\) .*/|\1 |')
	# PID, netns inode (of every process we may look at), state, command.
	stat -L -c '%n %i' /proc/[0-9]*/ns/net 2>/dev/null | sed 's|^/proc/\([0-9]*\)/ns/net|\1|' >"$work/pidns"
	ps -e -o pid=,stat=,args= >"$work/ps"
	for rec in "$work"/.nsfleet-netns/procs/*/daemon.json; do
		[ -e "$rec" ] || continue
		echo "$(basename "$(dirname "$rec")") $(sed -n 's/.*"pid": \([0-9]*\),/\1/p' "$rec")"
	done >"$work/recs"
	echo "$pins" | awk -v want="$routers" -v pidns="$work/pidns" -v psf="$work/ps" -v recs="$work/recs" '
		{ ns[$1] = $2 }
		END {
			while ((getline l < recs) > 0) { split(l, f, " "); rec[f[1]] = f[2] }
			while ((getline l < psf) > 0) {
				n = split(l, f, " "); pid = f[1]; st[pid] = f[2]
				cmd[pid] = ""; for (i = 3; i <= n; i++) cmd[pid] = cmd[pid] (i > 3 ? " " : "") f[i]
			}
			bad = 0; count = 0
			while ((getline l < pidns) > 0) {
				split(l, f, " "); pid = f[1]; name = ns[f[2]]
				if (name == "" || !(pid in st) || st[pid] ~ /^Z/) continue
				if (cmd[pid] !~ /(^|\/)sleep 100000$/) { print "  orphan in " name ": pid " pid ": " cmd[pid]; bad++; continue }
				if (rec[name] != pid) { print "  daemon pid " pid " in " name " does not match its record (" rec[name] ")"; bad++ }
				count++; per[name]++
			}
			for (n in per) if (per[n] > 1) { print "  " per[n] " daemons in " n; bad++ }
			if (count != want) { print "  " count " daemons, want " want; bad++ }
			exit bad > 0
		}'
}

converged() {
	local why=0 pm veths
	if ! nsf ls -f "$spec" -o json >"$work/ls.json" 2>"$work/ls.err"; then
		echo "  ls -f: $(grep -c '"state": "ok"' "$work/ls.json") of $routers ok"
		why=1
	fi
	pm=$(pins_mounts)
	if [ "$pm" != "$routers $routers" ]; then
		echo "  pins and mounts: $pm, want $routers $routers"
		why=1
	fi
	# A dump can be cut short while the kernel frees other namespaces: try
	# a few times before calling it a difference.
	for _ in 1 2 3 4 5; do
		veths=$(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | grep -c "^${prefix}[og][0-9]*@" || true)
		[ "$veths" = $((2 * routers)) ] && break
		sleep 0.5
	done
	if [ "$veths" != $((2 * routers)) ]; then
		echo "  host veths: $veths, want $((2 * routers))"
		why=1
	fi
	check_daemons || why=1
	return $why
}

# Usual durations (ms), measured once, bound the random kill delays.
t0=$(date +%s%N); nsf up -f "$spec" --progress none >/dev/null; t1=$(date +%s%N)
nsf down -f "$spec" --progress none --grace 1s >/dev/null; t2=$(date +%s%N)
up_ms=$(((t1 - t0) / 1000000 + 50)) down_ms=$(((t2 - t1) / 1000000 + 50))
echo "kill-campaign: $trials trials, $routers routers, seed $seed; up takes ~${up_ms} ms, down ~${down_ms} ms"

# The checks must be able to fail: plant an orphan daemon and a pin file
# without its mount on a converged fleet, and expect both to be caught.
nsf up -f "$spec" --progress none >/dev/null
converged >/dev/null || { echo "kill-campaign: the fleet does not converge even without kills" >&2; exit 1; }
"$bin" --run-dir "$rundir" exec "${prefix}bar-1" -- sleep 99999 >/dev/null 2>&1 &
planted=$! victim=$planted
touch "$rundir/${prefix}planted"
sleep 0.2
report=$(converged) && { echo "kill-campaign: the checks missed a planted orphan and a half-made pin" >&2; exit 1; }
case $report in
*"orphan in ${prefix}bar-1"*"pins and mounts"* | *"pins and mounts"*"orphan in ${prefix}bar-1"*) ;;
*) echo "kill-campaign: the checks did not name what was planted:" >&2; echo "$report" >&2; exit 1 ;;
esac
kill -9 "$planted"; wait "$planted" 2>/dev/null || true
victim=""
rm -f "$rundir/${prefix}planted"
echo "kill-campaign: self-check: a planted orphan and a half-made pin were caught"

ok=0 failed=0
declare -A per=()
for ((trial = 1; trial <= trials; trial++)); do
	IFS=, read -r -a cmds <<<"$kinds"
	what=${cmds[RANDOM % ${#cmds[@]}]}
	# Start from a random state: none, some or all of the fleet (a supervise
	# or exec --all trial starts from all of it).
	# (The previous trial left the whole fleet, converged.)
	state=$((RANDOM % 3))
	[ "$what" = up ] || state=2
	case $state in
	0) nsf down -f "$spec" --progress none --grace 1s >/dev/null 2>&1 || true ;;
	1) nsf down --prefix "${prefix}bar-1" --progress none --grace 1s >/dev/null 2>&1 || true ;;
	esac
	case $what in
	up) limit=$up_ms; "$bin" --run-dir "$rundir" up -f "$spec" --progress none >/dev/null 2>&1 & ;;
	down) limit=$down_ms; "$bin" --run-dir "$rundir" down -f "$spec" --progress none --grace 1s >/dev/null 2>&1 & ;;
	supervise)
		limit=2000
		# Kill a few daemons (ours, by the PIDs in their records) so the
		# supervisor has restarts to do.
		for rec in $(ls "$work"/.nsfleet-netns/procs/*/daemon.json | shuf -n 5); do
			pid=$(sed -n 's/.*"pid": \([0-9]*\),/\1/p' "$rec")
			[ -n "$pid" ] && grep -q "sleep" "/proc/$pid/cmdline" 2>/dev/null && kill -9 "$pid"
		done
		"$bin" --run-dir "$rundir" supervise -f "$spec" --backoff 50ms --tick 50ms >/dev/null 2>&1 & ;;
	exec) limit=$up_ms; "$bin" --run-dir "$rundir" exec --all -f "$spec" --parallel 16 -- sleep 0.05 >/dev/null 2>&1 & ;;
	esac
	victim=$!
	delay=$((RANDOM % limit))
	sleep "$(printf '0.%03d' "$delay")" 2>/dev/null || sleep "$((delay / 1000))"
	kill -9 "$victim" 2>/dev/null || true
	wait "$victim" 2>/dev/null || true
	victim=""
	# exec --all commands die with nsfleet (Pdeathsig); give them a moment.
	sleep 0.1
	if ! nsf up -f "$spec" --progress none >"$work/rerun.out" 2>&1; then
		echo "trial $trial: $what killed at ${delay} ms: rerun failed: $(tail -1 "$work/rerun.out")"
		failed=$((failed + 1)); per[$what]=$((${per[$what]:-0} + 1))
		continue
	fi
	if report=$(converged); then
		ok=$((ok + 1))
		echo "trial $trial: $what killed at ${delay} ms: converged"
	else
		failed=$((failed + 1)); per[$what]=$((${per[$what]:-0} + 1))
		echo "trial $trial: $what killed at ${delay} ms: NOT converged"
		echo "$report"
	fi
done
echo "kill-campaign: $ok/$trials trials converged ($routers routers, seed $seed)"
[ "$failed" = 0 ]
