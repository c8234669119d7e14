// Package fastexec makes `nsfleet exec NAME CMD` cost about as much as
// running CMD: a C constructor, which runs when the binary is loaded and
// before the Go runtime starts (as runc's nsenter does), recognises the
// command line, enters the network namespace pinned as NAME with setns(2),
// and execs CMD in place. No Go runtime is started, no process is forked,
// and CMD inherits nsfleet's PID, so signals and the exit status are CMD's
// own.
//
// The constructor takes every spelling that cobra accepts for it:
//
//	nsfleet [GLOBAL FLAGS] exec [GLOBAL FLAGS] [--] NAME [--] CMD [ARGS...]
//
// where the global flags are --run-dir, --workers/-w, --verbose/-v and
// --wait-lock. It steps aside (returns to the Go program, with nothing
// changed) for anything else (--mount-ns and --all among them), and
// whenever something fails before the exec (a missing pin, a symlink, a
// command not found): the Go code then does the same work and reports the
// error properly. Its name check is package names' rule, held to it by a
// test. Setting NSFLEET_NO_FASTEXEC=1 turns it off. It is compiled only
// with cgo; without it, exec takes the Go path, which also execs in place.
//
// Import it for its side effect: import _ ".../internal/fastexec".
package fastexec
