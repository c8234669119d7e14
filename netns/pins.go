package netns

// Reading a run dir's pins: list, names, one by name.

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Pin describes one entry of the run dir.
type PinInfo struct {
	Name    string
	Mounted bool   // an nsfs mount is on it
	Inode   uint64 // the namespace's inode when Mounted
	Mounts  int    // how many mounts are stacked on it (more than 1 is a double pin)
	Symlink bool
}

// PinState classifies a run dir entry; every caller decides from it.
type PinState int

const (
	PinNamespace  PinState = iota // a namespace is mounted on it
	PinStale                      // a file with nothing mounted: a crash between create and mount
	PinSymlink                    // never followed
	PinOtherMount                 // something other than a namespace is mounted on it
)

// State classifies the entry.
func (p PinInfo) State() PinState {
	switch {
	case p.Symlink:
		return PinSymlink
	case p.Mounted:
		return PinNamespace
	case p.Mounts > 0:
		return PinOtherMount
	}
	return PinStale
}

// List returns the run dir's entries sorted by name, with their mount state
// taken from mountinfo (no namespace is opened).
func (d *RunDir) List() ([]PinInfo, error) {
	f, err := os.Open(d.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil // a run dir not made yet holds no pins
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.Path, err)
	}
	defer f.Close()
	// Mounts first, then the directory, both streamed: the pins' mount
	// table lines and directory entries are never all held at once.
	type mstate struct {
		n     int
		inode uint64
	}
	byName := map[string]*mstate{}
	err = ScanMountInfo(func(m *Mount) {
		if filepath.Dir(m.MountPoint) != d.Path {
			return
		}
		name := filepath.Base(m.MountPoint)
		s := byName[name]
		if s == nil {
			s = &mstate{}
			byName[strings.Clone(name)] = s
		}
		s.n++
		s.inode = 0
		if m.FSType == "nsfs" {
			s.inode, _ = ParseNsLink(m.Root)
		}
	})
	if err != nil {
		return nil, err
	}
	var out []PinInfo
	for {
		ents, err := f.ReadDir(4096)
		for _, e := range ents {
			pi := PinInfo{Name: e.Name(), Symlink: e.Type()&os.ModeSymlink != 0}
			if s := byName[pi.Name]; s != nil {
				pi.Mounts = s.n
				pi.Mounted = s.inode != 0
				pi.Inode = s.inode
			}
			out = append(out, pi)
		}
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("list %s: %w", d.Path, err)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

// Names returns the names of the run dir's entries, unsorted, without
// their mount state: one directory read, no mountinfo (which grows with
// every mount on the machine: at 40,000 pins, reading it was most of the
// cost of an agent's reconcile of one namespace).
func (d *RunDir) Names() ([]string, error) {
	f, err := os.Open(d.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.Path, err)
	}
	defer f.Close()
	out, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.Path, err)
	}
	return out, nil
}

// Lookup returns what List says of the entry called name, from the entry
// itself (statx and statfs) instead of mountinfo: found is false when there
// is no such entry. It cannot count stacked mounts: Mounts is 1 for any
// mount. For a few names among many pins it costs two system calls each,
// where List reads every mount of the machine.
func (d *RunDir) Lookup(name string) (pi PinInfo, found bool, err error) {
	if err := checkName(name); err != nil {
		return PinInfo{}, false, err
	}
	p := d.PinPath(name)
	const mask = unix.STATX_TYPE | unix.STATX_INO | unix.STATX_MNT_ID
	var st unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, p, unix.AT_SYMLINK_NOFOLLOW, mask, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return PinInfo{}, false, nil
		}
		return PinInfo{}, false, fmt.Errorf("pin %s: %w", p, err)
	}
	pi.Name = name
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		pi.Symlink = true
		return pi, true, nil
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(p, &fs); err != nil {
		return PinInfo{}, false, fmt.Errorf("pin %s: %w", p, err)
	}
	if fs.Type == unix.NSFS_MAGIC {
		pi.Mounted, pi.Mounts, pi.Inode = true, 1, st.Ino
		return pi, true, nil
	}
	// Not nsfs: something else is mounted on it when it is in another
	// mount than the run dir (or, before Linux 5.8, on another device).
	var dir unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, d.Path, unix.AT_SYMLINK_NOFOLLOW, mask, &dir); err != nil {
		return PinInfo{}, false, fmt.Errorf("list %s: %w", d.Path, err)
	}
	other := st.Dev_major != dir.Dev_major || st.Dev_minor != dir.Dev_minor
	if st.Mask&dir.Mask&unix.STATX_MNT_ID != 0 {
		other = st.Mnt_id != dir.Mnt_id
	}
	if other {
		pi.Mounts = 1
	}
	return pi, true, nil
}
