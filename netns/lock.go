package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/nsfleet/nsfleet/internal/lockfile"
	"golang.org/x/sys/unix"
)

// Lock is nsfleet's exclusive claim on a run dir: two nsfleet runs on one run
// dir never interleave. It is a lock file beside the run dir (not in it:
// `ip netns list` would show it, and iproute2 briefly flocks the run dir
// itself).
type Lock struct{ l *lockfile.Lock }

// ErrLocked is returned when another nsfleet holds the lock.
var ErrLocked = errors.New("another nsfleet is working on this run dir")

// LockPath returns the lock file used for the run dir.
func (d *RunDir) LockPath() string {
	return filepath.Join(filepath.Dir(d.Path), "."+filepath.Base(d.Path)+".nsfleet.lock")
}

// Lock takes the run dir's lock. With wait false it fails at once with
// ErrLocked (naming the holder's PID) when another nsfleet holds it.
func (d *RunDir) Lock(wait bool) (*Lock, error) {
	l, err := lockfile.Acquire(d.LockPath(), wait)
	var held *lockfile.HeldError
	if errors.As(err, &held) {
		return nil, fmt.Errorf("%w (lock %s held by pid %s); wait for it or pass --wait-lock", ErrLocked, held.Path, held.PID)
	}
	if err != nil {
		return nil, err
	}
	return &Lock{l: l}, nil
}

// Unlock releases the lock. The kernel releases it too if the process dies.
func (l *Lock) Unlock() error {
	if l == nil {
		return nil
	}
	return l.l.Release()
}

// GuardDefaultRunDir notes how /run/netns and nsfleet's lock beside it are
// before work that must use them (ip knows no other run dir), and returns
// what puts them back: when the run dir holds no pin afterwards, the mount
// made on it is undone and a directory made for it is removed.
func GuardDefaultRunDir() (restore func()) {
	_, statErr := os.Stat(DefaultRunDir)
	existed := statErr == nil
	wasMount := false
	if rd, err := OpenRunDir(DefaultRunDir, false); err == nil {
		if st, err := rd.State(); err == nil {
			wasMount = st.IsMountPoint
		}
	}
	lock := (&RunDir{Path: DefaultRunDir}).LockPath()
	_, lockErr := os.Stat(lock)
	return func() {
		ents, err := os.ReadDir(DefaultRunDir)
		if err == nil && len(ents) > 0 {
			return // someone's pins: leave it all
		}
		if err == nil {
			if !wasMount {
				for i := 0; i < 8 && unix.Unmount(DefaultRunDir, unix.MNT_DETACH) == nil; i++ {
				}
			}
			if !existed {
				os.Remove(DefaultRunDir)
			}
		}
		if lockErr != nil {
			os.Remove(lock)
		}
	}
}
