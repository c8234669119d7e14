package netns_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { nstest.Main(m) }

// TestCreateDoConcurrent runs many Create and Do calls at once and checks
// that each function ran in the right namespace and that no thread of the
// process was left in another one.
func TestCreateDoConcurrent(t *testing.T) {
	nstest.RequireRoot(t)
	home, err := netns.Current()
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for i := 0; i < 100; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var seen uint64
			h, err := netns.Create(func(in *netns.NS) error {
				cur, err := netns.Current()
				if err != nil {
					return err
				}
				defer cur.Close()
				seen = cur.Inode()
				return nil
			})
			if err != nil {
				errs <- err
				return
			}
			defer h.Close()
			if seen != h.Inode() || seen == home.Inode() {
				errs <- errors.New("Create ran fn outside the new namespace")
			}
			for k := 0; k < 3; k++ {
				err := netns.Do(h, func() error {
					cur, err := netns.Current()
					if err != nil {
						return err
					}
					defer cur.Close()
					if cur.Inode() != h.Inode() {
						return errors.New("Do ran fn outside the namespace")
					}
					return nil
				})
				if err != nil {
					errs <- err
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assertThreadsHome(t, home)
}

// A Thread enters namespace after namespace on its own thread, and is
// back home between them and after Close.
func TestThreadEntersInTurn(t *testing.T) {
	nstest.RequireRoot(t)
	home, err := netns.Current()
	if err != nil {
		t.Fatal(err)
	}
	defer home.Close()
	var hs []*netns.NS
	for i := 0; i < 3; i++ {
		h, err := netns.Create(nil)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Close()
		hs = append(hs, h)
	}
	errs := make(chan error, 10)
	done := make(chan struct{})
	go func() {
		defer close(done)
		th, err := netns.LockThread()
		if err != nil {
			errs <- err
			return
		}
		defer th.Close()
		inode := func() uint64 {
			cur, err := netns.Current()
			if err != nil {
				errs <- err
				return 0
			}
			defer cur.Close()
			return cur.Inode()
		}
		for _, h := range hs {
			var inside uint64
			if err := th.Do(h, func() error { inside = inode(); return nil }); err != nil {
				errs <- err
			}
			if inside != h.Inode() {
				errs <- errors.New("Thread.Do ran fn outside the namespace")
			}
			if inode() != home.Inode() {
				errs <- errors.New("the thread was not back home after Thread.Do")
			}
		}
		want := errors.New("fn's error")
		if err := th.Do(hs[0], func() error { return want }); !errors.Is(err, want) {
			errs <- errors.New("Thread.Do lost fn's error")
		}
	}()
	<-done
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	assertThreadsHome(t, home)
}

func assertThreadsHome(t *testing.T, home *netns.NS) {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		var st unix.Stat_t
		if err := unix.Stat("/proc/self/task/"+e.Name()+"/ns/net", &st); err != nil {
			continue // thread exited
		}
		if st.Ino != home.Inode() {
			t.Errorf("thread %s is in net:[%d], not at home", e.Name(), st.Ino)
		}
	}
}

func TestPinOpenUnpin(t *testing.T) {
	rd := nstest.RunDir(t)
	if _, err := rd.Setup(); err != nil {
		t.Fatal(err)
	}
	st, err := rd.State()
	if err != nil || !st.IsMountPoint || st.Propagation != "shared" {
		t.Fatalf("after Setup: %+v %v", st, err)
	}
	h, err := netns.Create(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := rd.Pin("a", h); err != nil {
		t.Fatal(err)
	}
	if err := rd.Pin("a", h); !errors.Is(err, netns.ErrExists) {
		t.Fatalf("second pin: %v, want ErrExists", err)
	}
	got, err := rd.Open("a")
	if err != nil {
		t.Fatal(err)
	}
	if got.Inode() != h.Inode() {
		t.Fatal("pin opens another namespace")
	}
	got.Close()
	pins, err := rd.List()
	if err != nil || len(pins) != 1 || !pins[0].Mounted || pins[0].Inode != h.Inode() || pins[0].Mounts != 1 {
		t.Fatalf("List = %+v, %v", pins, err)
	}
	// OpenKnown takes the inode List saw; one that no longer matches
	// gets Open's checks, and the namespace actually there.
	for _, inode := range []uint64{h.Inode(), h.Inode() + 1} {
		got, err := rd.OpenKnown("a", inode)
		if err != nil || got.Inode() != h.Inode() {
			t.Fatalf("OpenKnown(a, %d) = %v, %v", inode, got, err)
		}
		got.Close()
	}
	// A pin file with nothing mounted on it is no namespace, whatever
	// inode the caller believes.
	if err := os.WriteFile(rd.PinPath("stale"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	var fst syscall.Stat_t
	if err := syscall.Stat(rd.PinPath("stale"), &fst); err != nil {
		t.Fatal(err)
	}
	if _, err := rd.OpenKnown("stale", fst.Ino); !errors.Is(err, netns.ErrNotNamespace) {
		t.Fatalf("OpenKnown(stale pin) = %v, want ErrNotNamespace", err)
	}
	os.Remove(rd.PinPath("stale"))
	// A symlink in the run dir is never followed.
	if err := os.Symlink("/etc/passwd", rd.PinPath("evil")); err != nil {
		t.Fatal(err)
	}
	if _, err := rd.Open("evil"); !errors.Is(err, netns.ErrSymlink) {
		t.Fatalf("Open(symlink) = %v, want ErrSymlink", err)
	}
	if _, err := rd.OpenKnown("evil", h.Inode()); !errors.Is(err, netns.ErrSymlink) {
		t.Fatalf("OpenKnown(symlink) = %v, want ErrSymlink", err)
	}
	if err := rd.Pin("evil", h); !errors.Is(err, netns.ErrSymlink) {
		t.Fatalf("Pin(symlink) = %v, want ErrSymlink", err)
	}
	os.Remove(rd.PinPath("evil"))
	if err := rd.Unpin("a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rd.PinPath("a")); !os.IsNotExist(err) {
		t.Fatalf("pin file still there: %v", err)
	}
	if err := rd.Unpin("a"); err != nil {
		t.Fatalf("unpin of a missing pin: %v", err)
	}
}

// TestLookupAgreesWithList: what Lookup reads from one entry is what List
// reads from mountinfo, for each kind of entry.
func TestLookupAgreesWithList(t *testing.T) {
	rd := nstest.RunDir(t)
	if _, err := rd.Setup(); err != nil {
		t.Fatal(err)
	}
	h, err := netns.Create(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := rd.Pin("ns", h); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rd.Unpin("ns") })
	os.WriteFile(rd.PinPath("stale"), nil, 0o600)
	os.Symlink("/etc/passwd", rd.PinPath("link"))
	// A file of the run dir's own filesystem bind-mounted on an entry:
	// same device, another mount.
	os.WriteFile(rd.PinPath("other"), nil, 0o600)
	if err := syscall.Mount(rd.PinPath("stale"), rd.PinPath("other"), "", syscall.MS_BIND, ""); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Unmount(rd.PinPath("other"), syscall.MNT_DETACH) })
	list, err := rd.List()
	if err != nil || len(list) != 4 {
		t.Fatalf("List = %+v, %v", list, err)
	}
	for _, want := range list {
		got, found, err := rd.Lookup(want.Name)
		if err != nil || !found || got != want {
			t.Errorf("Lookup(%s) = %+v, %v, %v; List says %+v", want.Name, got, found, err, want)
		}
	}
	if _, found, err := rd.Lookup("missing"); found || err != nil {
		t.Errorf("Lookup(missing) = %v, %v", found, err)
	}
	names, err := rd.Names()
	slices.Sort(names)
	if err != nil || !slices.Equal(names, []string{"link", "ns", "other", "stale"}) {
		t.Errorf("Names = %v, %v", names, err)
	}
	// Setup again: the run dir is known to be a shared mount point.
	if did, err := rd.Setup(); err != nil || !strings.Contains(did, "already") {
		t.Errorf("second Setup: %q, %v", did, err)
	}
}

func TestOpenRunDirRefusesSymlink(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(dir+"/real", 0o755)
	os.Symlink(dir+"/real", dir+"/link")
	if _, err := netns.OpenRunDir(dir+"/link", false); !errors.Is(err, netns.ErrSymlink) {
		t.Fatalf("err = %v, want ErrSymlink", err)
	}
	os.WriteFile(dir+"/file", nil, 0o644)
	if _, err := netns.OpenRunDir(dir+"/file", false); err == nil {
		t.Fatal("accepted a file as run dir")
	}
}

// Holders names each way a namespace is held: a process inside, a process
// that has it open, a mount.
func TestHolders(t *testing.T) {
	nstest.RequireRoot(t)
	rd := nstest.RunDir(t)
	if _, err := rd.Setup(); err != nil {
		t.Fatal(err)
	}
	h, err := netns.Create(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := rd.Pin("held", h); err != nil {
		t.Fatal(err)
	}
	defer rd.Unpin("held")
	var sleeper *exec.Cmd
	err = netns.Do(h, func() error {
		sleeper = exec.Command("sleep", "60")
		return sleeper.Start()
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { sleeper.Process.Kill(); sleeper.Wait() }()
	// A process outside that holds the pin open by its path (its stdin):
	// its fd's link names the path, not "net:[N]".
	pin, err := os.Open(rd.PinPath("held"))
	if err != nil {
		t.Fatal(err)
	}
	opener := exec.Command("sleep", "60")
	opener.Stdin = pin
	err = opener.Start()
	pin.Close()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { opener.Process.Kill(); opener.Wait() }()
	if s := netns.ScanProcs(); !slices.Contains(s.Open[h.Inode()], opener.Process.Pid) || !slices.Contains(s.Inside[h.Inode()], sleeper.Process.Pid) {
		t.Errorf("ScanProcs: open by %v, inside %v; want pid %d open (by its path) and pid %d inside", s.Open[h.Inode()], s.Inside[h.Inode()], opener.Process.Pid, sleeper.Process.Pid)
	}
	got := strings.Join(netns.Holders(map[uint64]bool{h.Inode(): true})[h.Inode()], "; ")
	for _, want := range []string{
		fmt.Sprintf("pid %d (sleep) is inside", sleeper.Process.Pid),
		fmt.Sprintf("pid %d (", os.Getpid()), // has it open
		"mounted at " + rd.PinPath("held"),
	} {
		if !strings.Contains(got, want) {
			t.Errorf("holders %q do not say %q", got, want)
		}
	}
}
