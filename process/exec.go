// Package process runs commands inside network namespaces and supervises them.
//
// # Two ways in
//
// Start (the default) enters only the network namespace: the child is
// forked from a thread that netns.Do has switched into the namespace, so it
// starts there and needs no mount namespace of its own. That is all most
// daemons need, and it costs a fork and an exec whatever the number of
// mounts on the machine. `ip netns exec` instead makes a new mount namespace
// per command, which copies every mount (every /run/netns pin included) and
// remounts /sys: its cost grows with the fleet.
//
// With MountNS, the command also gets what `ip netns exec` gives it: a new
// mount namespace, slave to the host's, with /sys remounted so that it shows
// the namespace's devices, and each file of /etc/netns/NAME bound over the
// file of that name in /etc. A multithreaded Go process cannot setns or
// unshare its mount namespace, so nsfleet starts a copy of itself as a small
// helper: forked from a thread inside the network namespace with
// CLONE_NEWNS, the helper (see HelperMain) makes the mounts in its private
// mount namespace and then replaces itself with the command by execve. No Go
// thread of nsfleet ever changes mount namespace.
//
// # Less than root
//
// By default a command runs as nsfleet does. With Options.Privileges it is
// started through a second helper (PrivilegesHelperMain), which sets
// no_new_privs, drops capabilities from its bounding set, changes user and
// groups, raises the kept ones as ambient capabilities, and execs the
// command: every step on the one thread that calls execve.
//
// # Supervision
//
// Supervise keeps a spec's processes running. Its restart arithmetic is a
// pure Policy; it learns of exits from pidfds in one epoll set; records
// (see Store) are intent, checked against /proc, and a launch cut short by
// a crash is found again by the process's NSFLEET_PROCESS marker.
//
// # Threading contract
//
// Start calls netns.Do; it may be called from any goroutine. The returned
// command is an ordinary *exec.Cmd. Descriptors other than stdin, stdout and
// stderr are not passed (everything nsfleet opens is O_CLOEXEC).
package process

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"syscall"

	"github.com/nsfleet/nsfleet/netns"
)

// HelperArg is the first argument that makes nsfleet run as the mount
// namespace helper instead of as itself.
const HelperArg = "__nsfleet-mountns-helper"

// Options tune Start. The zero value runs the command with nsfleet's own
// stdio and environment, in the network namespace only.
type Options struct {
	MountNS bool      // also a new mount namespace, as `ip netns exec` gives
	Name    string    // the namespace's name, for /sys and /etc/netns (MountNS)
	Stdin   io.Reader // nil: nsfleet's stdin
	Stdout  io.Writer // nil: nsfleet's stdout
	Stderr  io.Writer // nil: nsfleet's stderr
	Env     []string  // nil: nsfleet's environment
	// Setpgid puts the command in a process group of its own (supervised
	// daemons: a signal to the group reaches their children too).
	Setpgid bool
	// DieWithParent has the kernel send the command SIGKILL when nsfleet
	// dies (exec --all: a killed nsfleet leaves no command running in a
	// namespace behind it).
	DieWithParent bool
	// Self is the nsfleet executable used as the MountNS or privileges
	// helper; empty means /proc/self/exe.
	Self string
	// Privileges, when they restrict anything, start the command through
	// the privileges helper, which drops them and execs it.
	Privileges Privileges
}

// Command builds, without starting it, the *exec.Cmd that Start would start.
func Command(argv []string, opts Options) (*exec.Cmd, error) {
	if len(argv) == 0 {
		return nil, errors.New("no command")
	}
	var cmd *exec.Cmd
	self := opts.Self
	if self == "" {
		self = "/proc/self/exe"
	}
	switch {
	case opts.MountNS && opts.Privileges.Restricts():
		return nil, errors.New("a command cannot have both a mount namespace and restricted privileges")
	case opts.Privileges.Restricts():
		settings, err := opts.Privileges.helperArgs()
		if err != nil {
			return nil, err
		}
		args := append(append(append([]string{PrivilegesHelperArg}, settings...), "--"), argv...)
		cmd = exec.Command(self, args...)
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	case opts.MountNS:
		if opts.Name == "" {
			return nil, errors.New("mount namespace mode needs the namespace's name")
		}
		cmd = exec.Command(self, append([]string{HelperArg, opts.Name, "--"}, argv...)...)
		// The helper changes its own mounts: give it a mount namespace of
		// its own at clone time (Unshareflags would make / private, not
		// slave as iproute2 does).
		cmd.SysProcAttr = &syscall.SysProcAttr{Cloneflags: syscall.CLONE_NEWNS}
	default:
		path, err := exec.LookPath(argv[0])
		if err != nil {
			return nil, err
		}
		cmd = exec.Command(path, argv[1:]...)
		cmd.Args[0] = argv[0] // as the spec wrote it, as a shell would
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Setpgid = opts.Setpgid
	if opts.DieWithParent {
		cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if opts.Stdin != nil {
		cmd.Stdin = opts.Stdin
	}
	if opts.Stdout != nil {
		cmd.Stdout = opts.Stdout
	}
	if opts.Stderr != nil {
		cmd.Stderr = opts.Stderr
	}
	cmd.Env = opts.Env
	return cmd, nil
}

// Start starts cmd (from Command) inside the network namespace ns.
func Start(ns *netns.NS, cmd *exec.Cmd) error {
	return netns.Do(ns, cmd.Start)
}

// ExitCode turns the result of cmd.Wait into a shell-style exit code:
// the command's own, or 128+N when a signal N ended it.
func ExitCode(err error) (int, error) {
	if err == nil {
		return 0, nil
	}
	var ee *exec.ExitError
	if !errors.As(err, &ee) {
		return -1, err
	}
	ws, ok := ee.Sys().(syscall.WaitStatus)
	if ok && ws.Signaled() {
		return 128 + int(ws.Signal()), nil
	}
	return ee.ExitCode(), nil
}

// helperFail reports why the helper could not set up the mounts or exec
// the command, and exits 125 (as env(1) and nsenter do for their own
// failures, so the command's own codes stay distinguishable).
func helperFail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "nsfleet exec: "+format+"\n", a...)
	os.Exit(125)
}
