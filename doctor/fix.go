package doctor

import (
	"fmt"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"golang.org/x/sys/unix"
)

// Fix repairs what is safe to repair and provably nsfleet's, and says what
// it did: stale pin files that carry nsfleet's mark are removed, and extra
// mounts stacked on a pin of a namespace that carries nsfleet's lo alias
// are unmounted (all of them the same namespace, so nothing is lost). It
// touches nothing else.
func Fix(e *Environment) ([]string, error) {
	if !e.RunDirExists {
		return nil, nil
	}
	var done []string
	for _, p := range e.Pins {
		switch {
		case !p.Mounted && p.Mounts == 0 && e.RunDir.MarkedStale(p.Name):
			if err := e.RunDir.Unpin(p.Name); err != nil {
				return done, err
			}
			done = append(done, "removed stale pin file "+e.RunDir.PinPath(p.Name)+" (it carries nsfleet's mark)")
		case !p.Mounted && p.Mounts == 0:
			done = append(done, "left stale pin file "+e.RunDir.PinPath(p.Name)+" alone: no nsfleet mark, it may be another tool's")
		case p.Mounted && p.Mounts > 1:
			msg, err := collapse(e, p)
			if err != nil {
				return done, err
			}
			done = append(done, msg)
		}
	}
	return done, nil
}

// collapse unmounts the extra mounts stacked on one pin.
func collapse(e *Environment, p netns.PinInfo) (string, error) {
	path := e.RunDir.PinPath(p.Name)
	roots := map[string]bool{}
	for _, m := range e.Mounts {
		if m.MountPoint == path {
			if m.FSType != "nsfs" {
				return "left " + path + " alone: something other than a namespace is mounted there", nil
			}
			roots[m.Root] = true
		}
	}
	if len(roots) != 1 {
		return fmt.Sprintf("left %s alone: %d different namespaces are stacked there", path, len(roots)), nil
	}
	h, err := e.RunDir.Open(p.Name)
	if err != nil {
		return "", err
	}
	owned, err := rtnl.Owned(h)
	h.Close()
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if !owned {
		return "left " + path + " alone: the namespace is not nsfleet's", nil
	}
	for i := 1; i < p.Mounts; i++ {
		// The top mount goes; the one under it holds the same namespace.
		if err := unix.Unmount(path, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW); err != nil {
			return "", fmt.Errorf("unmount extra mount on %s: %w", path, err)
		}
	}
	return fmt.Sprintf("unmounted %d extra mounts stacked on %s (the same nsfleet namespace)", p.Mounts-1, path), nil
}
