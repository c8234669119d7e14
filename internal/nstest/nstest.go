// Package nstest gives privileged tests throwaway run dirs and unique
// name prefixes, cleans up after them unconditionally, and checks that a
// test binary leaks no namespaces, links, mounts, fds or threads.
//
// Tests never touch what they did not make: every name they create starts
// with the prefix from Prefix, and cleanup removes only such names.
package nstest

import (
	"fmt"
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
	_, statErr := os.Stat(netns.DefaultRunDir)
	existed := statErr == nil
	wasMount := false
	if rd, err := netns.OpenRunDir(netns.DefaultRunDir, false); err == nil {
		if st, err := rd.State(); err == nil {
			wasMount = st.IsMountPoint
		}
	}
	lock := filepath.Join(filepath.Dir(netns.DefaultRunDir), "."+filepath.Base(netns.DefaultRunDir)+".nsfleet.lock")
	_, lockErr := os.Stat(lock)
	t.Cleanup(func() {
		if ents, err := os.ReadDir(netns.DefaultRunDir); err != nil || len(ents) > 0 {
			return
		}
		if !wasMount {
			for i := 0; i < 8 && unix.Unmount(netns.DefaultRunDir, unix.MNT_DETACH) == nil; i++ {
			}
		}
		if !existed {
			os.Remove(netns.DefaultRunDir)
		}
		if lockErr != nil {
			os.Remove(lock)
		}
	})
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

// Take records the current state.
func Take() Snapshot {
	var s Snapshot
	if c, err := rtnl.Open(); err == nil {
		if ls, err := c.Links(); err == nil {
			for _, l := range ls {
				s.Links = append(s.Links, l.Name)
			}
		}
		c.Close()
	}
	if ms, err := netns.ReadMountInfo(); err == nil {
		for _, m := range ms {
			s.Mounts = append(s.Mounts, m.MountPoint)
		}
	}
	if ents, err := os.ReadDir(netns.DefaultRunDir); err == nil {
		for _, e := range ents {
			s.Pins = append(s.Pins, e.Name())
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
	if os.Geteuid() != 0 {
		os.Exit(m.Run())
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
	}
	os.Exit(code)
}
