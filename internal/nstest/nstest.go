// Package nstest gives privileged tests throwaway run dirs and unique
// name prefixes, cleans up after them unconditionally, and checks that a
// test binary leaks no namespaces, links, mounts, fds or threads.
//
// Tests never touch what they did not make: every name they create starts
// with the prefix from Prefix, and cleanup removes only such names.
package nstest

import (
	"fmt"
	"github.com/nsfleet/nsfleet/internal/reexec"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"golang.org/x/sys/unix"
)

// RequireRoot skips the test unless it runs as root.
func RequireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (network namespaces, mounts)")
	}
}

var seq atomic.Int64

// Prefix returns a short name prefix unique to this process and call, such
// as "t4821a-". Interface names built from it stay within 15 bytes when the
// rest is at most 7 bytes.
func Prefix(t testing.TB) string {
	n := seq.Add(1)
	return fmt.Sprintf("t%d%c-", os.Getpid()%10000, 'a'+rune(n%26))
}

// FakeRouters returns the YAML of a fake-router fleet (the 2014 Neutron
// workload: lo up, ip_forward=1, two veth pairs) of count namespaces named
// PREFIXbar-N, with host veths PREFIXoN and PREFIXgN.
func FakeRouters(prefix string, count int) string {
	return fmt.Sprintf(`namespaces:
  - name: "%[1]sbar-{i}"
    count: %[2]d
    sysctls:
      net.ipv4.ip_forward: "1"
    veths:
      - host: "%[1]so{i}"
        peer: "qri-{i}"
      - host: "%[1]sg{i}"
        peer: "qgi-{i}"
`, prefix, count)
}

// SystemRunDir is for tests that must use the real /run/netns (ip(8) knows
// no other): when the test ends, if /run/netns was not a mount point before
// it and holds no pin now, the mount nsfleet or ip made on it is undone and
// a directory the test created is removed, so the host is left as found.
func SystemRunDir(t testing.TB) {
	t.Helper()
	RequireRoot(t)
	t.Cleanup(netns.GuardDefaultRunDir())
}

// InUserNamespace returns process attributes that start a child in a new
// user namespace (root mapped to root) with a mount namespace of its own:
// there a test may lower namespace limits without touching the host's.
func InUserNamespace() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: 0, Size: 1}},
	}
}

// RunDir makes a temporary run dir that is removed, with every pin and
// mount in it, when the test ends.
func RunDir(t testing.TB) *netns.RunDir {
	t.Helper()
	RequireRoot(t)
	base := t.TempDir()
	rd, err := netns.OpenRunDir(filepath.Join(base, "netns"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { CleanRunDir(t, rd) })
	return rd
}

// CleanRunDir unpins everything in rd and undoes rd's own mounts.
func CleanRunDir(t testing.TB, rd *netns.RunDir) {
	pins, err := rd.List()
	if err == nil {
		for _, p := range pins {
			if err := rd.Unpin(p.Name); err != nil {
				t.Errorf("cleanup: %v", err)
			}
		}
	}
	for i := 0; i < 8; i++ {
		if unix.Unmount(rd.Path, unix.MNT_DETACH) != nil {
			break
		}
	}
	os.Remove(rd.LockPath())
}

// DeleteHostLinks removes host links whose names start with prefix (links a
// test made directly, like a dummy used to provoke a conflict).
func DeleteHostLinks(t testing.TB, prefix string) {
	c, err := rtnl.Open()
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	defer c.Close()
	links, err := c.Links()
	if err != nil {
		t.Errorf("cleanup: %v", err)
		return
	}
	for _, l := range links {
		if strings.HasPrefix(l.Name, prefix) {
			c.DeleteLink(l.Index)
		}
	}
}

// WaitHostLinksGone waits until no host link starts with prefix (namespaces
// are freed asynchronously, and their veths with them).
func WaitHostLinksGone(t testing.TB, prefix string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		left := HostLinks(t, prefix)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("host links still present after %s: %v", timeout, left)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// HostLinks returns the names of host links starting with prefix.
func HostLinks(t testing.TB, prefix string) []string {
	c, err := rtnl.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	links, err := c.Links()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if strings.HasPrefix(l.Name, prefix) {
			out = append(out, l.Name)
		}
	}
	sort.Strings(out)
	return out
}

// Snapshot is what a test binary must leave as it found it.
type Snapshot struct {
	Links   []string
	Mounts  []string
	Pins    []string // of /run/netns
	FDs     int
	Threads map[string]int // netns of each thread -> count
}

// ours reports whether a link or pin name is this test binary's: made
// under a Prefix of this process ("t<pid>x-"), by a bench scenario of this
// process ("b<pid>-"), or as one of fleet.Down's sentinels ("nsfb<pid>-").
// Other test binaries run at the same time (go test runs packages in
// parallel) and make and remove their own objects: the leak check counts
// only this binary's, and .ci/run checks the whole host at the end.
func ours(name string) bool {
	pid := os.Getpid()
	if rest, ok := strings.CutPrefix(name, fmt.Sprintf("t%d", pid%10000)); ok {
		return len(rest) >= 2 && rest[0] >= 'a' && rest[0] <= 'z' && rest[1] == '-'
	}
	return strings.HasPrefix(name, fmt.Sprintf("b%d-", pid%100000)) ||
		strings.HasPrefix(name, fmt.Sprintf("nsfb%d-", pid%10000000))
}

// tmpRoot is this test binary's own temporary directory (see Main): every
// t.TempDir of the binary is under it, so a mount under it is this binary's.
var tmpRoot string

// oursMount reports whether a mount point is this test binary's: under its
// temporary directory, or a pin of its in /run/netns.
func oursMount(mp string) bool {
	if tmpRoot != "" && (mp == tmpRoot || strings.HasPrefix(mp, tmpRoot+"/")) {
		return true
	}
	dir, name := filepath.Split(mp)
	return filepath.Clean(dir) == netns.DefaultRunDir && ours(name)
}

// Take records the current state of what this test binary may make.
func Take() Snapshot {
	var s Snapshot
	if c, err := rtnl.Open(); err == nil {
		// Under load, with other test binaries changing links, a dump can
		// be cut short again and again; a missing list is no evidence.
		for try := 0; try < 5; try++ {
			ls, err := c.Links()
			if err != nil {
				time.Sleep(50 * time.Millisecond)
				continue
			}
			for _, l := range ls {
				if ours(l.Name) {
					s.Links = append(s.Links, l.Name)
				}
			}
			break
		}
		c.Close()
	}
	if ms, err := netns.ReadMountInfo(); err == nil {
		for _, m := range ms {
			if oursMount(m.MountPoint) {
				s.Mounts = append(s.Mounts, m.MountPoint)
			}
		}
	}
	if ents, err := os.ReadDir(netns.DefaultRunDir); err == nil {
		for _, e := range ents {
			if ours(e.Name()) {
				s.Pins = append(s.Pins, e.Name())
			}
		}
	}
	if ents, err := os.ReadDir("/proc/self/fd"); err == nil {
		s.FDs = len(ents)
	}
	s.Threads = map[string]int{}
	if ents, err := os.ReadDir("/proc/self/task"); err == nil {
		for _, e := range ents {
			if l, err := os.Readlink("/proc/self/task/" + e.Name() + "/ns/net"); err == nil {
				s.Threads[l]++
			}
		}
	}
	sort.Strings(s.Links)
	sort.Strings(s.Mounts)
	return s
}

// Diff describes what changed from before to after; empty means no leak.
// A change in the number of fds is tolerated within slack (the runtime and
// the test framework open a few on their own).
func Diff(before, after Snapshot) []string {
	var out []string
	if d := listDiff(before.Links, after.Links); d != "" {
		out = append(out, "links: "+d)
	}
	if d := listDiff(before.Mounts, after.Mounts); d != "" {
		out = append(out, "mounts: "+d)
	}
	if d := listDiff(before.Pins, after.Pins); d != "" {
		out = append(out, "/run/netns: "+d)
	}
	if after.FDs > before.FDs+2 {
		out = append(out, fmt.Sprintf("fds: %d before, %d after", before.FDs, after.FDs))
	}
	if len(after.Threads) > 1 {
		out = append(out, fmt.Sprintf("threads in more than one network namespace: %v", after.Threads))
	}
	return out
}

// listDiff reports what b has that a had not. Removals are not reported:
// other test binaries run in parallel and remove their own objects.
func listDiff(a, b []string) string {
	count := map[string]int{}
	for _, x := range a {
		count[x]--
	}
	for _, x := range b {
		count[x]++
	}
	var added []string
	for k, n := range count {
		for ; n > 0; n-- {
			added = append(added, k)
		}
	}
	if len(added) == 0 {
		return ""
	}
	sort.Strings(added)
	return fmt.Sprintf("added %v", trim(added))
}

func trim(s []string) []string {
	if len(s) > 10 {
		return append(s[:10:10], fmt.Sprintf("... %d more", len(s)-10))
	}
	return s
}

// Main runs a package's tests and fails the binary when they leaked. Use it
// from TestMain: func TestMain(m *testing.M) { nstest.Main(m) }.
func Main(m *testing.M) {
	reexec.Dispatch() // the test binary re-executed as one of nsfleet's helpers
	if os.Geteuid() != 0 {
		os.Exit(m.Run())
	}
	// A temporary directory of this binary's own, for every t.TempDir:
	// mounts under it are this binary's (see oursMount).
	if dir, err := os.MkdirTemp("", fmt.Sprintf("nsfleet-test-%d-", os.Getpid())); err == nil {
		if real, err := filepath.EvalSymlinks(dir); err == nil {
			dir = real
		}
		// Searchable by others, as /tmp is (tests that drop privileges
		// make a directory of their own in it); t.TempDir's are 0700.
		os.Chmod(dir, 0o755)
		tmpRoot = dir
		os.Setenv("TMPDIR", dir)
	}
	before := Take()
	code := m.Run()
	// Namespaces are freed asynchronously; give the kernel a moment.
	var diff []string
	for i := 0; i < 100; i++ {
		diff = Diff(before, Take())
		if len(diff) == 0 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if len(diff) > 0 {
		fmt.Fprintln(os.Stderr, "LEAK: the tests left behind:")
		for _, d := range diff {
			fmt.Fprintln(os.Stderr, "  "+d)
		}
		if code == 0 {
			code = 1
		}
	} else if tmpRoot != "" {
		os.RemoveAll(tmpRoot) // nothing is mounted under it any more
	}
	os.Exit(code)
}
