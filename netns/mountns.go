package netns

import (
	"fmt"
	"os"
	"os/exec"
	"runtime"

	"golang.org/x/sys/unix"
)

// Mount namespaces, for `nsfleet sim`: each simulated node has its own, so
// that its run dir and pins are its alone, as on a machine of its own. The
// threading contract above holds: every thread that enters or makes a mount
// namespace here first unshares its filesystem context (CLONE_FS), and is
// never handed back to the runtime (see disposable).

// disposable runs fn on a locked thread that the runtime destroys when fn
// returns. That thread must not be the main thread: Go cannot end the
// main thread, so one locked there is parked for good instead, in
// whatever namespaces fn left it. If the goroutine lands on it, it keeps
// the main thread busy while another goroutine, which then cannot land
// there, does the work.
func disposable(fn func()) {
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		if unix.Gettid() == unix.Getpid() {
			disposable(fn)
			runtime.UnlockOSThread()
			close(done)
			return
		}
		defer close(done)
		fn() // returns with the thread locked: it is destroyed
	}()
	<-done
}

// NewMountNS makes a mount namespace whose mounts are private to it
// (nothing propagates in or out), runs setup inside it, and pins it on an
// empty file at path (created here), like `unshare --mount=PATH`.
func NewMountNS(path string, setup func() error) error {
	type result struct {
		fd  int
		err error
	}
	ch := make(chan result, 1)
	disposable(func() {
		r := result{fd: -1}
		defer func() { ch <- r }()
		if err := unix.Unshare(unix.CLONE_FS | unix.CLONE_NEWNS); err != nil {
			r.err = fmt.Errorf("unshare mount namespace: %w", err)
			return
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			r.err = fmt.Errorf("make mounts private: %w", err)
			return
		}
		if setup != nil {
			if err := setup(); err != nil {
				r.err = err
				return
			}
		}
		r.fd, r.err = unix.Open("/proc/thread-self/ns/mnt", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	})
	r := <-ch
	if r.err != nil {
		return r.err
	}
	defer unix.Close(r.fd)
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("mount namespace pin: %w", err)
	}
	f.Close()
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", r.fd), path, "", unix.MS_BIND, ""); err != nil {
		os.Remove(path)
		return fmt.Errorf("mount namespace pin %s: %w", path, err)
	}
	return nil
}

// UnpinFile detaches what is mounted on a pin (of any namespace) and
// removes the file. A pin that is already gone is not an error.
func UnpinFile(path string) error {
	if err := unix.Unmount(path, unix.MNT_DETACH); err != nil && err != unix.EINVAL && err != unix.ENOENT {
		return fmt.Errorf("unpin %s: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !os.IsNotExist(err) {
		return fmt.Errorf("unpin %s: %w", path, err)
	}
	return nil
}

// enter switches the locked calling thread into the mount namespace pinned
// at mntPath ("": stay) and the network namespace ns (nil: stay).
func enter(mntPath string, ns *NS) error {
	if mntPath != "" {
		fd, err := unix.Open(mntPath, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("open mount namespace %s: %w", mntPath, err)
		}
		defer unix.Close(fd)
		if err := unix.Unshare(unix.CLONE_FS); err != nil {
			return fmt.Errorf("unshare filesystem context: %w", err)
		}
		if err := unix.Setns(fd, unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("enter mount namespace %s: %w", mntPath, err)
		}
	}
	if ns != nil {
		if err := unix.Setns(ns.fd, unix.CLONE_NEWNET); err != nil {
			return fmt.Errorf("setns %s: %w", ns, err)
		}
	}
	return nil
}

// InMountNS runs fn on a thread inside the mount namespace pinned at
// mntPath; the thread is not reused.
func InMountNS(mntPath string, fn func() error) error {
	ch := make(chan error, 1)
	disposable(func() {
		if err := enter(mntPath, nil); err != nil {
			ch <- err
			return
		}
		ch <- fn()
	})
	return <-ch
}

// StartIn starts cmd inside the network namespace ns (nil: this one) and
// the mount namespace pinned at mntPath ("": this one). The child inherits
// the namespaces of the thread that forks it, so it is forked from a
// thread that entered them and is not reused.
func StartIn(cmd *exec.Cmd, ns *NS, mntPath string) error {
	ch := make(chan error, 1)
	disposable(func() {
		if err := enter(mntPath, ns); err != nil {
			ch <- err
			return
		}
		ch <- cmd.Start()
	})
	return <-ch
}
