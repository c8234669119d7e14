package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/internal/exitcode"
	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
	"golang.org/x/sys/unix"
)

// Faults planted for real: each test checks the error names the cause,
// nothing half-made is left (no pin file without its mount, no orphan
// process), and a rerun once the fault is gone converges to the spec.

// smallFS mounts a tmpfs of its own (opts: size=, nr_inodes=) and returns
// its path; it is unmounted when the test ends, after later cleanups.
func smallFS(t *testing.T, opts string) string {
	t.Helper()
	nstest.RequireRoot(t)
	dir := filepath.Join(t.TempDir(), "fs")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("nsfleet-test", dir, "tmpfs", 0, opts); err != nil {
		t.Skipf("mount tmpfs: %v", err)
	}
	t.Cleanup(func() {
		for i := 0; i < 8 && unix.Unmount(dir, unix.MNT_DETACH) == nil; i++ {
		}
	})
	return dir
}

// runDirIn opens a run dir inside dir and cleans it up at the end.
func runDirIn(t *testing.T, dir string) *netns.RunDir {
	t.Helper()
	rd, err := netns.OpenRunDir(filepath.Join(dir, "netns"), true)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nstest.CleanRunDir(t, rd) })
	return rd
}

// assertNoHalfPins fails if a pin file has no namespace mounted on it.
func assertNoHalfPins(t *testing.T, rd *netns.RunDir) {
	t.Helper()
	pins, err := rd.List()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pins {
		if !p.Mounted || p.Mounts != 1 {
			t.Errorf("pin %s: mounted %v, %d mounts: half-made", p.Name, p.Mounted, p.Mounts)
		}
	}
}

// assertConverges reruns up and checks ls -f finds everything as the spec
// says.
func assertConverges(t *testing.T, rd *netns.RunDir, spec string) {
	t.Helper()
	if code, out, errs := run("--run-dir", rd.Path, "up", "-f", spec, "--progress", "none"); code != 0 {
		t.Fatalf("rerun after the fault: code %d\n%s%s", code, out, errs)
	}
	code, out, errs := run("--run-dir", rd.Path, "ls", "-f", spec, "-o", "json")
	var st []fleet.Status
	if err := json.Unmarshal([]byte(out), &st); err != nil || code != 0 {
		t.Fatalf("ls after the rerun: code %d %v\n%s%s", code, err, out, errs)
	}
	assertNoHalfPins(t, rd)
}

func TestRunDirFilesystemFull(t *testing.T) {
	fs := smallFS(t, "size=1m,nr_inodes=40")
	rd := runDirIn(t, fs)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	spec := writeSpec(t, p, 30)
	// Use up the inodes (pins need one each), leaving a few.
	var fill []string
	for i := 0; ; i++ {
		f := filepath.Join(fs, fmt.Sprintf("fill-%d", i))
		if err := os.WriteFile(f, nil, 0o600); err != nil {
			break
		}
		fill = append(fill, f)
	}
	for _, f := range fill[len(fill)-5:] {
		os.Remove(f)
	}
	code, out, errs := run("--run-dir", rd.Path, "up", "-f", spec, "--progress", "none")
	if code != exitcode.Failed || !strings.Contains(errs, "no space left on device") || !strings.Contains(errs, "0 of 40 inodes") || !strings.Contains(out+errs, " failed") {
		t.Fatalf("up on a full run dir: code %d\n%s%s", code, out, errs)
	}
	assertNoHalfPins(t, rd)
	for _, f := range fill {
		os.Remove(f)
	}
	assertConverges(t, rd, spec)
}

func TestRunDirReadOnly(t *testing.T) {
	fs := smallFS(t, "size=1m")
	rd := runDirIn(t, fs)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	t.Cleanup(func() { unix.Mount("", fs, "", unix.MS_REMOUNT, "size=1m") })
	small, big := writeSpec(t, p, 2), writeSpec(t, p, 4)
	if code, out, errs := run("--run-dir", rd.Path, "up", "-f", small, "--progress", "none"); code != 0 {
		t.Fatalf("up: %s%s", out, errs)
	}
	if err := unix.Mount("", fs, "", unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
		t.Fatal(err)
	}
	code, out, errs := run("--run-dir", rd.Path, "up", "-f", big, "--progress", "none")
	if code != exitcode.Failed || !strings.Contains(errs, "read-only") || !strings.Contains(out+errs, "2 unchanged, 2 failed") {
		t.Fatalf("up on a read-only run dir: code %d\n%s%s", code, out, errs)
	}
	code, out, errs = run("--run-dir", rd.Path, "down", "-f", big, "--progress", "none")
	if code != exitcode.Failed || !strings.Contains(errs, "read-only filesystem: nothing deleted") {
		t.Fatalf("down on a read-only run dir: code %d\n%s%s", code, out, errs)
	}
	assertNoHalfPins(t, rd)
	if err := unix.Mount("", fs, "", unix.MS_REMOUNT, "size=1m"); err != nil {
		t.Fatal(err)
	}
	assertConverges(t, rd, big)
}

func TestRunDirWritableByOthersRefused(t *testing.T) {
	nstest.RequireRoot(t)
	base := t.TempDir()
	p := nstest.Prefix(t)
	spec := writeSpec(t, p, 1)
	for _, c := range []struct {
		name  string
		plant func(dir string) error
		want  string
	}{
		{"world-writable run dir", func(d string) error { return os.Chmod(d, 0o777) }, "mode 0777"},
		{"group-writable parent", func(d string) error { return os.Chmod(filepath.Dir(d), 0o775) }, "mode 0775"},
		{"parent owned by a user", func(d string) error { return os.Chown(filepath.Dir(d), 1000, 1000) }, "belongs to uid 1000"},
	} {
		parent := filepath.Join(base, strings.ReplaceAll(c.name, " ", "-"))
		dir := filepath.Join(parent, "netns")
		os.MkdirAll(dir, 0o755)
		if err := c.plant(dir); err != nil {
			t.Fatal(err)
		}
		for _, args := range [][]string{{"up", "-f", spec}, {"ls"}, {"down", "--prefix", p}} {
			code, out, errs := run(append([]string{"--run-dir", dir}, args...)...)
			if code == 0 || !strings.Contains(errs, c.want) || !strings.Contains(errs, "writable by another user") && !strings.Contains(errs, "not root") {
				t.Errorf("%s: %s: code %d\n%s%s", c.name, args[0], code, out, errs)
			}
		}
		if ents, _ := os.ReadDir(dir); len(ents) != 0 {
			t.Errorf("%s: something was made in the refused run dir: %v", c.name, ents)
		}
		os.Chown(parent, 0, 0)
	}
}

// Another tool deletes namespaces (as `ip netns del` does) and host links
// while up runs: up finishes and reports, and a rerun converges.
func TestConcurrentDeletionDuringUp(t *testing.T) {
	rd := nstest.RunDir(t)
	p := nstest.Prefix(t)
	t.Cleanup(func() { nstest.DeleteHostLinks(t, p) })
	spec := writeSpec(t, p, 300)
	up := child("--run-dir", rd.Path, "up", "-f", spec, "--progress", "none")
	var upOut strings.Builder
	up.Stdout, up.Stderr = &upOut, &upOut
	if err := up.Start(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var deleted int
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			// Every few ms: one namespace unpinned, one host veth deleted.
			name := fmt.Sprintf("%sbar-%d", p, 1+(i*7)%300)
			if rd.Unpin(name) == nil {
				deleted++
			}
			exec.Command("ip", "link", "del", fmt.Sprintf("%sg%d", p, 1+(i*11)%300)).Run()
			time.Sleep(3 * time.Millisecond)
		}
	}()
	err := up.Wait()
	close(stop)
	wg.Wait()
	if ee, ok := err.(*exec.ExitError); err != nil && (!ok || ee.ExitCode() != exitcode.Failed) {
		t.Fatalf("up while another tool deletes: %v\n%s", err, upOut.String())
	}
	if !strings.Contains(upOut.String(), "up: ") {
		t.Fatalf("no summary:\n%s", upOut.String())
	}
	if deleted == 0 {
		t.Fatal("the test deleted nothing while up ran")
	}
	assertNoHalfPins(t, rd)
	assertConverges(t, rd, spec)
}

// The filesystem of the process logs fills up: the start fails with the
// cause named, no process runs without its log, and a rerun once there is
// room starts them.
func TestProcessLogDiskFull(t *testing.T) {
	fs := smallFS(t, "size=256k")
	rd := runDirIn(t, fs)
	p := nstest.Prefix(t)
	spec := filepath.Join(t.TempDir(), "procs.yaml")
	os.WriteFile(spec, []byte(fmt.Sprintf(`namespaces:
  - name: "%[1]sl{i}"
    count: 3
    processes:
      - name: sleeper
        command: ["sleep", "1000"]
`, p)), 0o644)
	t.Cleanup(func() { run("--run-dir", rd.Path, "down", "-f", spec, "--grace", "1s") })
	filler := filepath.Join(fs, "filler")
	f, _ := os.Create(filler)
	buf := make([]byte, 4096)
	for {
		if _, err := f.Write(buf); err != nil {
			break
		}
	}
	f.Close()
	code, out, errs := run("--run-dir", rd.Path, "up", "-f", spec, "--progress", "none")
	if code != exitcode.Failed || !strings.Contains(errs, "no space left on device") || !strings.Contains(errs, "KiB free") {
		t.Fatalf("up with a full log filesystem: code %d\n%s%s", code, out, errs)
	}
	for i := 1; i <= 3; i++ {
		if pids := inNamespace(t, rd.PinPath(fmt.Sprintf("%sl%d", p, i))); len(pids) != 0 {
			t.Errorf("%sl%d: processes %v run although their log could not be written", p, i, pids)
		}
	}
	assertNoHalfPins(t, rd)
	os.Remove(filler)
	assertConverges(t, rd, spec)
	for i := 1; i <= 3; i++ {
		if pids := inNamespace(t, rd.PinPath(fmt.Sprintf("%sl%d", p, i))); len(pids) != 1 {
			t.Errorf("%sl%d: %d processes after the rerun, want 1", p, i, len(pids))
		}
	}
}
