// Package netns creates, enters, pins and unpins Linux network namespaces.
//
// # Threading contract
//
// A network namespace belongs to an OS thread, not to a process, and the Go
// runtime moves goroutines between threads freely. This package is the only
// one in nsfleet that changes a thread's namespace (unshare, setns) or calls
// runtime.LockOSThread for that purpose. Everything else holds namespaces as
// file descriptors (*NS) and works through them: a netlink socket opened
// inside a namespace stays bound to it from any thread, a veth peer is
// placed by fd, a pin is a bind mount of /proc/self/fd/N.
//
// Create and Do run a function on a fresh goroutine locked to its OS thread.
// When the function returns, the thread is switched back to the namespace it
// started in. Only if that switch succeeds is the thread unlocked and handed
// back to the runtime; otherwise the goroutine exits still locked, and the
// runtime destroys the thread. A thread left in a foreign namespace can thus
// never run other goroutines. (Inside a user namespace, switching back to
// a namespace owned by the parent user namespace always fails: each call
// then costs one thread, see ThreadsDiscarded.)
//
// One exception, by design: the lab's re-exec helpers (bench.ChurnHelperMain
// and bench.UeventHelperMain) are processes of their own that lock their
// main thread and unshare on it in a loop, as the threads' experiments do;
// that thread is never handed back, and the process exits when done, so no
// goroutine of nsfleet ever runs in a namespace it did not ask for.
//
// The function passed to Create or Do runs on that one thread: it may make
// system calls that act on "the current namespace" (open a netlink socket,
// open a sysctl file), but must not start goroutines that expect to inherit
// the namespace, and must not unlock the thread itself.
//
// A worker that enters namespace after namespace (a read of a whole fleet)
// may instead keep its own goroutine's thread with LockThread, and enter
// each with Thread.Do: the same rules, the same switch back, no goroutine
// per call. Should that switch back fail, the thread stays locked to the
// worker's goroutine, which ends with it (see Thread).
//
// # Pins
//
// A pin is what iproute2 calls a named namespace: an empty file in the run
// dir (normally /run/netns) with the namespace bind-mounted on it. RunDir
// sets the directory up as current iproute2 does, so `ip netns list`,
// `ip -n NAME`, `ip netns exec` and `ip netns del` work on nsfleet's pins and
// nsfleet sees iproute2's.
//
// All descriptors are opened O_CLOEXEC and closed as soon as they are done.
package netns

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/nsfleet/nsfleet/internal/pool"
	"golang.org/x/sys/unix"
)

// NSFS_MAGIC is the filesystem magic of nsfs, where namespace files live.
const nsfsMagic = 0x6e736673

// NS is an open handle on a network namespace. Close it when done: an open
// handle keeps the namespace alive.
type NS struct {
	fd    int
	inode uint64
}

// Fd returns the descriptor. It stays valid until Close.
func (n *NS) Fd() int { return n.fd }

// Inode identifies the namespace (as `ls -i`, `lsns` and /proc/PID/ns show).
func (n *NS) Inode() uint64 { return n.inode }

// Path returns a path that names the namespace while the handle is open.
func (n *NS) Path() string { return "/proc/self/fd/" + strconv.Itoa(n.fd) }

// Close releases the handle. It is safe to call twice.
func (n *NS) Close() error {
	if n == nil || n.fd < 0 {
		return nil
	}
	err := unix.Close(n.fd)
	n.fd = -1
	return err
}

func (n *NS) String() string { return fmt.Sprintf("net:[%d]", n.inode) }

// ErrNotNamespace is returned when a file is not a network namespace.
var ErrNotNamespace = errors.New("not a network namespace")

// OpenPath opens the namespace at path (a pin, or /proc/PID/ns/net).
func OpenPath(path string) (*NS, error) {
	fd, err := open(path, unix.O_RDONLY|unix.O_CLOEXEC)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	n, err := fromFd(fd)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return n, nil
}

func fromFd(fd int) (*NS, error) {
	var fs unix.Statfs_t
	if err := unix.Fstatfs(fd, &fs); err != nil {
		return nil, err
	}
	if fs.Type != nsfsMagic {
		return nil, ErrNotNamespace
	}
	// NS_GET_NSTYPE would be exact; on nsfs, the inode plus a net-specific
	// ioctl is enough: CLONE_NEWNET is what NS_GET_NSTYPE returns for net.
	t, err := unix.IoctlRetInt(fd, unix.NS_GET_NSTYPE)
	if err == nil && t != unix.CLONE_NEWNET {
		return nil, ErrNotNamespace
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	nsfsDev.CompareAndSwap(0, uint64(st.Dev))
	return &NS{fd: fd, inode: st.Ino}, nil
}

// nsfsDev is nsfs's device number, learnt from the first namespace opened
// (see RunDir.OpenKnown); 0 until then.
var nsfsDev atomic.Uint64

// Current opens the network namespace of the calling thread. Outside Create
// and Do that is the namespace nsfleet was started in.
func Current() (*NS, error) {
	return OpenPath("/proc/thread-self/ns/net")
}

// home is the namespace nsfleet was started in, opened once, on first use,
// by a thread that is still in it (every thread outside Create and Do is).
// Create and Do switch back to it: opening it per call cost a procfs path
// walk and three more system calls per namespace entered.
var home struct {
	once sync.Once
	ns   *NS
}

// homeNS returns the start namespace, or opens the calling thread's (which
// the caller closes) if the shared handle could not be opened.
func homeNS() (ns *NS, shared bool, err error) {
	home.once.Do(func() {
		if h, err := Current(); err == nil {
			home.ns = h
		}
	})
	if home.ns != nil {
		return home.ns, true, nil
	}
	ns, err = Current()
	return ns, false, err
}

// open is open(2) that waits out a lack of descriptors (see pool.Retry).
func open(path string, flags int) (int, error) {
	return pool.RetryValue(func() (int, error) { return unix.Open(path, flags, 0) })
}

// discarded counts threads that could not be switched back.
var discarded atomic.Int64

// ThreadsDiscarded reports how many OS threads were given up because they
// could not be switched back to their namespace. They cost a new thread
// each, nothing else: the work ran, and no goroutine ever runs on them again.
func ThreadsDiscarded() int64 { return discarded.Load() }

// Create makes a new network namespace and runs fn inside it on a locked
// thread (see the threading contract above). It returns a handle on the new
// namespace; if fn fails, the handle is closed and the namespace is freed by
// the kernel. The namespace is not pinned: pin it with RunDir.Pin.
func Create(fn func(inside *NS) error) (*NS, error) {
	type result struct {
		ns  *NS
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var r result
		defer func() { ch <- r }()
		runtime.LockOSThread()
		orig, shared, err := homeNS()
		if err != nil {
			runtime.UnlockOSThread()
			r.err = fmt.Errorf("open own namespace: %w", err)
			return
		}
		if !shared {
			defer orig.Close()
		}
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			runtime.UnlockOSThread()
			r.err = unshareError(err)
			return
		}
		// From here the thread is in the new namespace.
		inside, err := Current()
		if err == nil && fn != nil {
			if ferr := fn(inside); ferr != nil {
				inside.Close()
				inside, err = nil, ferr
			}
		}
		if serr := unix.Setns(orig.fd, unix.CLONE_NEWNET); serr != nil {
			// Leave the thread locked: the goroutine exits and the
			// runtime destroys the thread with it. The namespace itself
			// is fine. (This is the normal case inside a user namespace,
			// which may make network namespaces but not re-enter the
			// host's.)
			discarded.Add(1)
			r.ns, r.err = inside, err
			return
		}
		runtime.UnlockOSThread()
		r.ns, r.err = inside, err
	}()
	r := <-ch
	return r.ns, r.err
}

// Thread is the calling goroutine's OS thread, kept locked so that it can
// enter namespaces one after another: Thread.Do is Do without a goroutine
// per call. (Such a goroutine's stack grew twice on its way to the kernel;
// with its start and scheduling that was a tenth of a fleet's read.) A
// pool worker that enters a namespace per item holds one for its life.
//
// The goroutine that called LockThread is the only one to call Do and
// Close, and nothing else it does may depend on its thread's network
// namespace (it works through descriptors, as all of nsfleet outside this
// package does). Should a switch back ever fail, the thread stays locked
// in that namespace until the goroutine ends (Close leaves it locked, and
// the runtime destroys a thread whose goroutine exits locked), and later
// calls of Do run as the package's Do does.
type Thread struct {
	home *NS
	lost bool
}

// LockThread locks the calling goroutine to its thread and checks that the
// thread may switch back to the start namespace; where it may not (inside
// a user namespace that does not own it), it returns the error, and the
// caller uses Do.
func LockThread() (*Thread, error) {
	runtime.LockOSThread()
	home, shared, err := homeNS()
	if err == nil && !shared {
		home.Close()
		err = errors.New("no handle on the start namespace")
	}
	if err == nil {
		// The thread is in the start namespace already: the switch
		// changes nothing, and checks the permission a switch back needs.
		if serr := unix.Setns(home.fd, unix.CLONE_NEWNET); serr != nil {
			err = fmt.Errorf("setns to own namespace: %w", serr)
		}
	}
	if err != nil {
		runtime.UnlockOSThread()
		return nil, err
	}
	return &Thread{home: home}, nil
}

// Do runs fn inside ns on t's thread (see the threading contract: fn may
// not start goroutines that expect the namespace, nor unlock the thread).
// On a nil t it is the package's Do.
func (t *Thread) Do(ns *NS, fn func() error) error {
	if t == nil || t.lost {
		return Do(ns, fn)
	}
	if err := unix.Setns(ns.fd, unix.CLONE_NEWNET); err != nil {
		return fmt.Errorf("setns %s: %w", ns, err)
	}
	err := fn()
	if serr := unix.Setns(t.home.fd, unix.CLONE_NEWNET); serr != nil {
		t.lost = true
		discarded.Add(1)
		return errors.Join(err, fmt.Errorf("switch back from %s: %w (thread given up)", ns, serr))
	}
	return err
}

// Close unlocks the thread, unless a switch back failed (see Thread).
func (t *Thread) Close() {
	if t != nil && !t.lost {
		runtime.UnlockOSThread()
	}
}

// ErrLimit is matched by errors.Is when the kernel refuses a new namespace
// because a limit was reached (ENOSPC from unshare).
var ErrLimit = errors.New("network namespace limit reached")

func unshareError(err error) error {
	if errors.Is(err, unix.ENOSPC) {
		limit := "?"
		if b, rerr := os.ReadFile("/proc/sys/user/max_net_namespaces"); rerr == nil {
			limit = string(trimNL(b))
		}
		return fmt.Errorf("unshare: %w (user.max_net_namespaces is %s; namespaces being freed count too: wait for teardown to finish): %v", ErrLimit, limit, err)
	}
	return fmt.Errorf("unshare: %w", err)
}

func trimNL(b []byte) []byte {
	for len(b) > 0 && (b[len(b)-1] == '\n' || b[len(b)-1] == ' ') {
		b = b[:len(b)-1]
	}
	return b
}

// Do runs fn on a locked thread inside ns (see the threading contract).
func Do(ns *NS, fn func() error) error {
	ch := make(chan error, 1)
	go func() {
		var err error
		defer func() { ch <- err }()
		runtime.LockOSThread()
		orig, shared, oerr := homeNS()
		if oerr != nil {
			runtime.UnlockOSThread()
			err = fmt.Errorf("open own namespace: %w", oerr)
			return
		}
		if !shared {
			defer orig.Close()
		}
		if serr := unix.Setns(ns.fd, unix.CLONE_NEWNET); serr != nil {
			runtime.UnlockOSThread()
			err = fmt.Errorf("setns %s: %w", ns, serr)
			return
		}
		err = fn()
		if serr := unix.Setns(orig.fd, unix.CLONE_NEWNET); serr != nil {
			discarded.Add(1)
			return // still locked: the thread dies with this goroutine
		}
		runtime.UnlockOSThread()
	}()
	return <-ch
}
