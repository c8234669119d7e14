package process

import (
	"errors"
	"fmt"
	"github.com/nsfleet/nsfleet/internal/reexec"
	"os"
	"os/exec"
	"os/user"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"unsafe"

	"github.com/nsfleet/nsfleet/spec"
	"golang.org/x/sys/unix"
)

// Privileges take rights away from a command. The zero value takes none:
// the command runs as nsfleet does (root, every capability).
type Privileges struct {
	User  string // name or UID; "": root
	Group string // name or GID; "": the user's primary group
	// Caps, if not nil, are the capability numbers the command keeps,
	// as ambient capabilities; all others leave its bounding set.
	Caps       []int
	NoNewPrivs bool
}

// PrivilegesOf turns a spec process's settings into Privileges.
func PrivilegesOf(p spec.Process) Privileges {
	pr := Privileges{User: p.User, Group: p.Group, NoNewPrivs: p.NoNewPrivs}
	if p.Capabilities != nil {
		pr.Caps = []int{}
		for _, c := range p.Capabilities {
			if n, ok := spec.CapabilityNumber(c); ok {
				pr.Caps = append(pr.Caps, n)
			}
		}
	}
	return pr
}

// Restricts reports whether pr takes anything away.
func (pr Privileges) Restricts() bool {
	return pr.User != "" || pr.Group != "" || pr.Caps != nil || pr.NoNewPrivs
}

// ids resolves the user and group to numbers and the user's supplementary
// groups. A numeric user unknown to the system gets the GID of the same
// number (never root's group) and no supplementary groups.
func (pr Privileges) ids() (uid, gid int, groups []int, set bool, err error) {
	if pr.User == "" && pr.Group == "" {
		return 0, 0, nil, false, nil
	}
	uid, gid = 0, 0
	if pr.User != "" {
		u, lerr := user.Lookup(pr.User)
		if lerr != nil {
			n, aerr := strconv.Atoi(pr.User)
			if aerr != nil || n < 0 {
				return 0, 0, nil, false, fmt.Errorf("user %q: %w", pr.User, lerr)
			}
			uid, gid = n, n
		} else {
			uid, _ = strconv.Atoi(u.Uid)
			gid, _ = strconv.Atoi(u.Gid)
			if gs, gerr := u.GroupIds(); gerr == nil {
				for _, g := range gs {
					if n, err := strconv.Atoi(g); err == nil {
						groups = append(groups, n)
					}
				}
			}
		}
	}
	if pr.Group != "" {
		g, lerr := user.LookupGroup(pr.Group)
		if lerr != nil {
			n, aerr := strconv.Atoi(pr.Group)
			if aerr != nil || n < 0 {
				return 0, 0, nil, false, fmt.Errorf("group %q: %w", pr.Group, lerr)
			}
			gid = n
		} else {
			gid, _ = strconv.Atoi(g.Gid)
		}
	}
	return uid, gid, groups, true, nil
}

// PrivilegesHelperArg makes nsfleet run as the helper that drops
// privileges and then execs the command (see PrivilegesHelperMain).
const PrivilegesHelperArg = "__nsfleet-privileges-helper"

// helperArgs encodes pr for the helper: uid=U gid=G groups=A,B caps=C,D|none
// nnp=1, each only when set.
func (pr Privileges) helperArgs() ([]string, error) {
	uid, gid, groups, set, err := pr.ids()
	if err != nil {
		return nil, err
	}
	var out []string
	if set {
		out = append(out, "uid="+strconv.Itoa(uid), "gid="+strconv.Itoa(gid), "groups="+joinInts(groups))
	}
	if pr.Caps != nil {
		c := joinInts(pr.Caps)
		if c == "" {
			c = "none"
		}
		out = append(out, "caps="+c)
	}
	if pr.NoNewPrivs {
		out = append(out, "nnp=1")
	}
	return out, nil
}

func joinInts(v []int) string {
	s := make([]string, len(v))
	for i, n := range v {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ",")
}

func splitInts(s string) ([]int, error) {
	if s == "" || s == "none" {
		return []int{}, nil
	}
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(f)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("bad number %q", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// PrivilegesHelperMain drops privileges as its arguments say (from
// helperArgs, then "--", then the command) and execs the command. It runs in
// a fresh process that nsfleet started inside the namespace, and returns
// only by exiting. Every step acts on the calling thread, the one that
// calls execve: the kernel gives the new program that thread's credentials.
func init() { reexec.Register(PrivilegesHelperArg, PrivilegesHelperMain) }

func PrivilegesHelperMain(args []string) {
	runtime.LockOSThread()
	i := 0
	for i < len(args) && args[i] != "--" {
		i++
	}
	if i+1 >= len(args) {
		privilegesFail("privileges helper: want SETTINGS -- CMD [ARGS...]")
	}
	argv := args[i+1:]
	var (
		uid, gid   = -1, -1
		groups     []int
		caps       []int
		nnp        bool
		err        error
		setIDs     bool
		capsGiven  bool
		lastCap, _ = lastCapability()
	)
	for _, kv := range args[:i] {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "uid":
			uid, err = strconv.Atoi(v)
			setIDs = true
		case "gid":
			gid, err = strconv.Atoi(v)
		case "groups":
			groups, err = splitInts(v)
		case "caps":
			caps, err = splitInts(v)
			capsGiven = true
		case "nnp":
			nnp = v == "1"
		default:
			err = fmt.Errorf("unknown setting %q", kv)
		}
		if err != nil {
			privilegesFail("privileges helper: %v", err)
		}
	}
	if nnp {
		if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
			privilegesFail("%s: no_new_privs: %v", argv[0], err)
		}
	}
	keep := map[int]bool{}
	for _, c := range caps {
		keep[c] = true
	}
	if capsGiven {
		for c := 0; c <= lastCap; c++ {
			if !keep[c] {
				if err := unix.Prctl(unix.PR_CAPBSET_DROP, uintptr(c), 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
					privilegesFail("%s: drop capability %d from the bounding set: %v", argv[0], c, err)
				}
			}
		}
	}
	if setIDs {
		if capsGiven {
			// Keep the permitted set across the UID change; it is cut down
			// to exactly caps below.
			if err := unix.Prctl(unix.PR_SET_KEEPCAPS, 1, 0, 0, 0); err != nil {
				privilegesFail("%s: keepcaps: %v", argv[0], err)
			}
		}
		if err := setgroupsThread(groups); err != nil {
			privilegesFail("%s: setgroups: %v", argv[0], err)
		}
		// Raw system calls: they change this thread only, which is the one
		// that execs (the libc and Go wrappers would change every thread,
		// which Go refuses to do in a cgo binary).
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, uintptr(gid), uintptr(gid), uintptr(gid)); e != 0 {
			privilegesFail("%s: setresgid %d: %v", argv[0], gid, e)
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uintptr(uid), uintptr(uid), uintptr(uid)); e != 0 {
			privilegesFail("%s: setresuid %d: %v", argv[0], uid, e)
		}
	}
	if capsGiven {
		var data [2]unix.CapUserData
		for _, c := range caps {
			if c > 63 {
				continue
			}
			data[c/32].Permitted |= 1 << (c % 32)
			data[c/32].Effective |= 1 << (c % 32)
			data[c/32].Inheritable |= 1 << (c % 32)
		}
		hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
		if err := unix.Capset(&hdr, &data[0]); err != nil {
			privilegesFail("%s: capset: %v", argv[0], err)
		}
		for _, c := range caps {
			if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_RAISE, uintptr(c), 0, 0); err != nil {
				privilegesFail("%s: raise ambient capability %s: %v", argv[0], spec.Capabilities[c], err)
			}
		}
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		privilegesFail("%s: %v", argv[0], err)
	}
	err = syscall.Exec(path, argv, os.Environ())
	privilegesFail("exec %s: %v", argv[0], err)
}

func setgroupsThread(groups []int) error {
	g := make([]uint32, len(groups))
	for i, n := range groups {
		g[i] = uint32(n)
	}
	var p unsafe.Pointer
	if len(g) > 0 {
		p = unsafe.Pointer(&g[0])
	}
	if _, _, e := unix.RawSyscall(unix.SYS_SETGROUPS, uintptr(len(g)), uintptr(p), 0); e != 0 {
		return e
	}
	return nil
}

// lastCapability is the highest capability number the kernel knows.
func lastCapability() (int, error) {
	b, err := os.ReadFile("/proc/sys/kernel/cap_last_cap")
	if err != nil {
		return len(spec.Capabilities) - 1, err
	}
	return strconv.Atoi(strings.TrimSpace(string(b)))
}

// privilegesFail reports why the privileges helper could not drop what it
// was asked to, or exec the command, in the process's log (its stderr),
// and exits 125, as the mount helper does: the process then counts as a
// failed start, never as the command running with more than it should.
func privilegesFail(format string, a ...any) {
	fmt.Fprintf(os.Stderr, "nsfleet: start process: "+format+"\n", a...)
	os.Exit(125)
}
