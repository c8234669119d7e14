// Package lockfile is nsfleet's one way to claim something exclusively: a
// flock(2) on a small file that also names the holder's PID, so a refusal
// can say who holds it. The kernel drops the lock when its holder dies, so
// a crash never leaves a stale claim; the PID in the file is only a hint.
package lockfile

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrHeld is matched by errors.Is when another process holds the lock.
var ErrHeld = errors.New("lock held by another process")

// HeldError says who holds a lock.
type HeldError struct {
	Path string
	PID  string // as written by the holder; may be empty
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("lock %s held by pid %s", e.Path, e.PID)
}

func (e *HeldError) Is(target error) bool { return target == ErrHeld }

// Lock is a held lock.
type Lock struct{ f *os.File }

// Acquire takes the lock at path, creating the file (0600) if needed. With
// wait, it blocks until the lock is free; without, it fails at once with a
// *HeldError. The file is never followed through a symlink.
func Acquire(path string, wait bool) (*Lock, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0o600)
	readOnly := false
	if errors.Is(err, unix.EROFS) {
		// A read-only filesystem: an existing lock file still locks (flock
		// needs no write access); it just cannot name its holder.
		f, err = os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_CLOEXEC, 0)
		readOnly = true
	}
	if err != nil {
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	how := unix.LOCK_EX
	if !wait {
		how |= unix.LOCK_NB
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, &HeldError{Path: path, PID: strings.TrimSpace(string(holder))}
		}
		return nil, fmt.Errorf("lock %s: %w", path, err)
	}
	if !readOnly {
		f.Truncate(0)
		f.WriteAt([]byte(fmt.Sprintf("%d\n", os.Getpid())), 0)
	}
	return &Lock{f: f}, nil
}

// Release drops the lock. It is safe on a nil or released Lock.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	l.f.Truncate(0)
	err := l.f.Close()
	l.f = nil
	return err
}
