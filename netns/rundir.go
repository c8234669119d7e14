package netns

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"

	"github.com/nsfleet/nsfleet/internal/names"
	"github.com/nsfleet/nsfleet/internal/pool"
	"golang.org/x/sys/unix"
)

// DefaultRunDir is where iproute2 keeps its pins.
const DefaultRunDir = "/run/netns"

// RunDir is a directory of pins.
type RunDir struct {
	// Path is the run dir with symlinks in its parents resolved, so it can be
	// matched against /proc/self/mountinfo.
	Path string

	// shared is the mount id of the run dir's own mount when Setup last
	// found it a shared mount point (0: not known): Setup then only checks
	// that the same mount is still there, instead of reading mountinfo.
	shared atomic.Uint64
}

// ErrSymlink is returned for a run dir or pin that is a symbolic link:
// nsfleet never follows a link out of the run dir.
var ErrSymlink = errors.New("is a symbolic link")

// OpenRunDir checks path and returns its RunDir. With create, a missing
// directory is made (0755, as iproute2 does) together with its parents.
func OpenRunDir(path string, create bool) (*RunDir, error) {
	if path == "" {
		path = DefaultRunDir
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("run dir %s: %w", path, err)
	}
	fi, err := os.Lstat(abs)
	if errors.Is(err, os.ErrNotExist) && create {
		if err := os.MkdirAll(abs, 0o755); err != nil {
			return nil, fmt.Errorf("run dir %s: %w", path, err)
		}
		fi, err = os.Lstat(abs)
	}
	if err != nil {
		return nil, fmt.Errorf("run dir %s: %w", path, err)
	}
	if fi.Mode()&os.ModeSymlink != 0 {
		return nil, fmt.Errorf("run dir %s: %w; give the directory it points to instead", path, ErrSymlink)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("run dir %s: not a directory", path)
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return nil, fmt.Errorf("run dir %s: %w", path, err)
	}
	if err := checkTrusted(real); err != nil {
		return nil, fmt.Errorf("run dir %s: %w", path, err)
	}
	return &RunDir{Path: real}, nil
}

// ErrUntrusted is matched by errors.Is when the run dir or a directory
// above it could be changed by another user.
var ErrUntrusted = errors.New("writable by another user")

// checkTrusted refuses a run dir that another user could tamper with, as
// ssh's StrictModes does for keys: the run dir and every directory above it
// must belong to root or to us, and none may be writable by group or
// others, except a parent with the sticky bit (like /tmp), where others
// may add entries but not replace ours.
func checkTrusted(dir string) error {
	euid := uint32(os.Geteuid())
	for d := dir; ; d = filepath.Dir(d) {
		var st unix.Stat_t
		if err := unix.Lstat(d, &st); err != nil {
			return err
		}
		if st.Uid != 0 && st.Uid != euid {
			return fmt.Errorf("%s belongs to uid %d, not root: %w; refusing it (chown root %s)", d, st.Uid, ErrUntrusted, d)
		}
		sticky := st.Mode&unix.S_ISVTX != 0 && d != dir
		if st.Mode&0o022 != 0 && !sticky {
			return fmt.Errorf("%s has mode %04o, %w; refusing it (chmod go-w %s)", d, st.Mode&0o7777, ErrUntrusted, d)
		}
		if d == "/" || d == "." {
			return nil
		}
	}
}

// PinPath returns the path of the pin called name.
func (d *RunDir) PinPath(name string) string { return filepath.Join(d.Path, name) }

// MountState describes the run dir's own mount, read from mountinfo.
type MountState struct {
	IsMountPoint bool
	Propagation  string // of the run dir's mount, or of the mount it lives on
	Parent       string // mount point that holds the run dir
	ParentProp   string
}

// State reads the run dir's mount state from /proc/self/mountinfo.
func (d *RunDir) State() (MountState, error) {
	var mounts []Mount // only those stateFrom looks at: not the pins
	err := ScanMountInfo(func(m *Mount) {
		if isUnder(d.Path, m.MountPoint) {
			mounts = append(mounts, *m)
		}
	})
	if err != nil {
		return MountState{}, err
	}
	return d.stateFrom(mounts), nil
}

func (d *RunDir) stateFrom(mounts []Mount) MountState {
	var st MountState
	// The last mount at a path is the visible one; the parent is the
	// longest mount point that is a prefix of the run dir.
	best := -1
	for i, m := range mounts {
		if m.MountPoint == d.Path {
			st.IsMountPoint = true
			st.Propagation = m.Propagation()
			best = i
		}
	}
	parentLen := -1
	for _, m := range mounts {
		if m.MountPoint == d.Path {
			continue
		}
		if isUnder(d.Path, m.MountPoint) && len(m.MountPoint) >= parentLen {
			parentLen = len(m.MountPoint)
			st.Parent = m.MountPoint
			st.ParentProp = m.Propagation()
		}
	}
	if best < 0 {
		st.Propagation = st.ParentProp
	}
	return st
}

func isUnder(path, dir string) bool {
	if dir == "/" {
		return true
	}
	return path == dir || strings.HasPrefix(path, dir+"/")
}

// Setup prepares the run dir as current iproute2 does before its first pin,
// but decides from mountinfo instead of by trial: under an exclusive flock
// on the directory, if it is not a mount point, bind it onto itself and make
// it private, then shared; if it is a mount point but not shared, make it
// shared. Shared pins propagate an unmount to every mount namespace, which
// lets the kernel free a namespace sooner. It returns what it did, for -v.
func (d *RunDir) Setup() (string, error) {
	if id := d.shared.Load(); id != 0 && d.mountID() == id {
		return "run dir " + d.Path + " already a shared mount point", nil
	}
	fd, err := unix.Open(d.Path, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return "", fmt.Errorf("run dir %s: open: %w", d.Path, err)
	}
	defer unix.Close(fd)
	// iproute2 takes the same lock, so the two never race on this step
	// (https://bugs.debian.org/949235: racing binds stack without bound).
	if err := unix.Flock(fd, unix.LOCK_EX); err != nil {
		return "", fmt.Errorf("run dir %s: flock: %w", d.Path, err)
	}
	defer unix.Flock(fd, unix.LOCK_UN)
	st, err := d.State()
	if err != nil {
		return "", err
	}
	var did []string
	if !st.IsMountPoint {
		if err := unix.Mount(d.Path, d.Path, "none", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return "", fmt.Errorf("run dir %s: bind onto itself: %w", d.Path, err)
		}
		if err := unix.Mount("", d.Path, "none", unix.MS_PRIVATE, ""); err != nil {
			return "", fmt.Errorf("run dir %s: make private: %w", d.Path, err)
		}
		// Marked as nsfleet's own bind, so that Release may undo it.
		unix.Setxattr(d.Path, RunDirMark, []byte("1"), 0)
		did = append(did, "bound onto itself, made private")
		st.Propagation = "private"
	}
	if st.Propagation != "shared" && st.Propagation != "shared+slave" {
		if err := unix.Mount("", d.Path, "none", unix.MS_SHARED|unix.MS_REC, ""); err != nil {
			return "", fmt.Errorf("run dir %s: make shared: %w", d.Path, err)
		}
		did = append(did, "made shared")
	}
	d.shared.Store(d.mountID())
	if len(did) == 0 {
		return "run dir " + d.Path + " already a shared mount point", nil
	}
	return "run dir " + d.Path + ": " + strings.Join(did, ", "), nil
}

// mountID returns the id of the mount whose root is the run dir, or 0 if
// the run dir is not a mount point (or the kernel cannot say: before 5.8).
func (d *RunDir) mountID() uint64 {
	var stx unix.Statx_t
	if err := unix.Statx(unix.AT_FDCWD, d.Path, unix.AT_SYMLINK_NOFOLLOW, unix.STATX_MNT_ID, &stx); err != nil {
		return 0
	}
	if stx.Mask&unix.STATX_MNT_ID == 0 || stx.Attributes_mask&unix.STATX_ATTR_MOUNT_ROOT == 0 ||
		stx.Attributes&unix.STATX_ATTR_MOUNT_ROOT == 0 {
		return 0
	}
	return stx.Mnt_id
}

// Pin bind-mounts ns onto an empty file called name in the run dir. The file
// is created exclusively; if an empty file without a mount is already there
// (left by a crash between create and mount), it is reused.
func (d *RunDir) Pin(name string, ns *NS) error {
	if err := checkName(name); err != nil {
		return err
	}
	p := d.PinPath(name)
	fd, err := open(p, unix.O_RDONLY|unix.O_CREAT|unix.O_EXCL|unix.O_CLOEXEC|unix.O_NOFOLLOW)
	if errors.Is(err, unix.EEXIST) {
		if serr := d.checkStale(name); serr != nil {
			return serr
		}
		err = nil
	} else if err == nil {
		// Mark the file as nsfleet's, so that doctor --fix may remove it if
		// a crash leaves it without its mount. Best effort: a filesystem
		// without trusted xattrs just gets no mark.
		unix.Fsetxattr(fd, PinMark, []byte("1"), 0)
		unix.Close(fd)
	}
	if err != nil {
		return fmt.Errorf("pin %s: create: %w%s", p, err, FullOrReadOnly(d.Path, err))
	}
	if err := bindNS(ns, p); err != nil {
		unix.Unlink(p)
		return fmt.Errorf("pin %s: bind mount: %w", p, err)
	}
	return nil
}

// bindNS bind-mounts the namespace onto path, with the mount API when the
// kernel has it (no path lookup through /proc), else with mount(2).
func bindNS(ns *NS, path string) error {
	tree, err := pool.RetryValue(func() (int, error) {
		return unix.OpenTree(ns.fd, "", unix.OPEN_TREE_CLONE|unix.OPEN_TREE_CLOEXEC|unix.AT_EMPTY_PATH)
	})
	if err != nil {
		// Before 5.2, or where seccomp forbids it.
		return unix.Mount(ns.Path(), path, "none", unix.MS_BIND, "")
	}
	defer unix.Close(tree)
	return unix.MoveMount(tree, "", unix.AT_FDCWD, path, unix.MOVE_MOUNT_F_EMPTY_PATH)
}

// FullOrReadOnly explains an error that a full or read-only filesystem
// causes: for ENOSPC, EDQUOT and EROFS it names the filesystem at path and
// what it has left, as " (filesystem of PATH: ...)"; otherwise "".
func FullOrReadOnly(path string, err error) string {
	if !errors.Is(err, unix.ENOSPC) && !errors.Is(err, unix.EDQUOT) && !errors.Is(err, unix.EROFS) {
		return ""
	}
	var fs unix.Statfs_t
	if unix.Statfs(path, &fs) != nil {
		return ""
	}
	if errors.Is(err, unix.EROFS) || fs.Flags&unix.ST_RDONLY != 0 {
		return fmt.Sprintf(" (the filesystem of %s is mounted read-only)", path)
	}
	return fmt.Sprintf(" (the filesystem of %s has %d of %d inodes and %d of %d KiB free)",
		path, fs.Ffree, fs.Files, fs.Bavail*uint64(fs.Bsize)/1024, fs.Blocks*uint64(fs.Bsize)/1024)
}

// ReadOnly reports whether the run dir's filesystem is mounted read-only.
func (d *RunDir) ReadOnly() bool {
	var fs unix.Statfs_t
	return unix.Statfs(d.Path, &fs) == nil && fs.Flags&unix.ST_RDONLY != 0
}

// RunDirMark is the extended attribute Setup sets on a run dir it binds
// onto itself: the bind is nsfleet's, and Release may undo it.
const RunDirMark = "trusted.nsfleet.rundir"

// Release undoes what Setup did to a run dir that is now empty: the bind
// of the directory onto itself, so that the directory can be removed like
// any other (rm -rf of a throwaway run dir would otherwise fail with
// "Device or resource busy"). It leaves alone /run/netns (iproute2 keeps
// it mounted too), a run dir with any entry, and a mount that nsfleet did
// not make (no RunDirMark). It reports whether it unmounted.
func (d *RunDir) Release() (bool, error) {
	if filepath.Clean(d.Path) == DefaultRunDir {
		return false, nil
	}
	buf := make([]byte, 4)
	if n, err := unix.Getxattr(d.Path, RunDirMark, buf); err != nil || n != 1 || buf[0] != '1' {
		return false, nil
	}
	st, err := d.State()
	if err != nil || !st.IsMountPoint {
		return false, err
	}
	ents, err := os.ReadDir(d.Path)
	if err != nil || len(ents) > 0 {
		return false, err
	}
	if err := unix.Unmount(d.Path, 0); err != nil {
		return false, fmt.Errorf("run dir %s: unmount nsfleet's bind: %w", d.Path, err)
	}
	d.shared.Store(0)
	// The mark is on the directory itself, under the bind: clear it.
	unix.Removexattr(d.Path, RunDirMark)
	return true, nil
}

// PinMark is the extended attribute nsfleet sets on the pin files it
// creates. It is on the empty file under the mount, so it is visible only
// when nothing is mounted there: exactly when a stale pin must be told apart.
const PinMark = "trusted.nsfleet"

// MarkedStale reports whether name is a pin file with nothing mounted on it
// that carries nsfleet's mark.
func (d *RunDir) MarkedStale(name string) bool {
	if d.checkStale(name) != nil {
		return false
	}
	buf := make([]byte, 8)
	n, err := unix.Lgetxattr(d.PinPath(name), PinMark, buf)
	return err == nil && n == 1 && buf[0] == '1'
}

// ErrExists is matched by errors.Is when a pin already holds a namespace.
var ErrExists = errors.New("already pinned")

// checkStale succeeds only if the pin is a regular empty file with nothing
// mounted on it.
func (d *RunDir) checkStale(name string) error {
	p := d.PinPath(name)
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		return fmt.Errorf("pin %s: %w", p, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFLNK {
		return fmt.Errorf("pin %s: %w", p, ErrSymlink)
	}
	var fs unix.Statfs_t
	if err := unix.Statfs(p, &fs); err == nil && fs.Type == nsfsMagic {
		return fmt.Errorf("pin %s: %w", p, ErrExists)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Size != 0 {
		return fmt.Errorf("pin %s: exists and is not an empty file", p)
	}
	return nil
}

// Unpin detaches the mount on the pin and removes the file, as `ip netns del`
// does. The kernel frees the namespace once nothing else holds it. A pin
// file with nothing mounted is just removed; a missing pin is not an error.
func (d *RunDir) Unpin(name string) error {
	if err := checkName(name); err != nil {
		return err
	}
	p := d.PinPath(name)
	// A pin may have several mounts stacked on it (two racing `ip netns add`
	// runs); detach until none is left.
	for i := 0; i < 16; i++ {
		err := unix.Unmount(p, unix.MNT_DETACH|unix.UMOUNT_NOFOLLOW)
		if err != nil {
			if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
				break // not a mount point (any more)
			}
			return fmt.Errorf("unpin %s: umount: %w", p, err)
		}
	}
	if err := unix.Unlink(p); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("unpin %s: unlink: %w", p, err)
	}
	return nil
}

// Open opens the namespace pinned as name. It fails with ErrNotNamespace on
// a pin file with nothing mounted, and never follows a symlink.
func (d *RunDir) Open(name string) (*NS, error) {
	fd, p, err := d.openPin(name)
	if err != nil {
		return nil, err
	}
	n, err := fromFd(fd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open %s: %w", p, err)
	}
	return n, nil
}

// openPin opens the pin file of name, never following a symlink.
func (d *RunDir) openPin(name string) (fd int, path string, err error) {
	if err := checkName(name); err != nil {
		return -1, "", err
	}
	path = d.PinPath(name)
	fd, err = open(path, unix.O_RDONLY|unix.O_CLOEXEC|unix.O_NOFOLLOW)
	if err != nil {
		if errors.Is(err, unix.ELOOP) {
			return -1, "", fmt.Errorf("open %s: %w", path, ErrSymlink)
		}
		return -1, "", &os.PathError{Op: "open", Path: path, Err: err}
	}
	return fd, path, nil
}

// OpenKnown is Open for a pin that List showed with inode mounted on it:
// when the opened file is still that namespace (same inode, on nsfs), one
// fstat proves it and the two other checks of Open are skipped; anything
// else gets Open's checks. Going through a whole fleet, that is two system
// calls fewer per namespace.
func (d *RunDir) OpenKnown(name string, inode uint64) (*NS, error) {
	dev := nsfsDev.Load()
	if inode == 0 || dev == 0 {
		return d.Open(name)
	}
	fd, p, err := d.openPin(name)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err == nil && st.Ino == inode && uint64(st.Dev) == dev {
		return &NS{fd: fd, inode: inode}, nil
	}
	n, err := fromFd(fd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open %s: %w", p, err)
	}
	return n, nil
}

func checkName(name string) error {
	if err := names.Namespace(name); err != nil {
		return fmt.Errorf("%w: %w", err, syscall.EINVAL)
	}
	return nil
}
