package cluster

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"time"

	"github.com/nsfleet/nsfleet/rtnl"
	"golang.org/x/sys/unix"
)

// driftWatch reports namespaces that may have drifted, from two sources
// that cost nothing while nothing happens:
//
//   - the run dir (inotify): a pin removed or replaced;
//   - one rtnl.Listener in the host namespace (NETLINK_LISTEN_ALL_NSID):
//     link, address, route and netconf (sysctl
//     forwarding) events of the host and of every namespace that has an id
//     here, which a namespace with a veth to the host always has. Host
//     events name the namespace through the host veth's name; the others
//     through their namespace id, learned from host veths' link-netnsid.
//
// The listener keeps only what can be drift (rtnl's socket filter), and
// is paused while the agent makes or removes many namespaces (quiet).
// Other sysctls send no event; the periodic full resync repairs them.
type driftWatch struct {
	mu      sync.Mutex
	byHost  map[string]string // host veth name -> namespace
	byNsid  map[int32]string  // namespace id in the host -> namespace
	pending map[string]bool
	unknown bool        // an event from a namespace not mapped yet: check all
	settle  *time.Timer // after a quiet spell: check all
	notify  chan struct{}
	fds     []int // inotify
	nl      *rtnl.Listener
}

func newDriftWatch(runDir string) (*driftWatch, error) {
	d := &driftWatch{byHost: map[string]string{}, byNsid: map[int32]string{}, pending: map[string]bool{}, notify: make(chan struct{}, 1)}
	in, err := unix.InotifyInit1(unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	if _, err := unix.InotifyAddWatch(in, runDir, unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO|unix.IN_CREATE); err != nil {
		unix.Close(in)
		return nil, fmt.Errorf("inotify %s: %w", runDir, err)
	}
	nl, err := rtnl.Listen()
	if err != nil {
		unix.Close(in)
		return nil, err
	}
	d.fds = []int{in}
	d.nl = nl
	return d, nil
}

// close closes both sources; run, if still going, then reads nothing.
func (d *driftWatch) close() {
	if d.fds == nil {
		return
	}
	for _, fd := range d.fds {
		unix.Close(fd)
	}
	d.fds = nil
	d.nl.Close()
	d.mu.Lock()
	if d.settle != nil {
		d.settle.Stop()
	}
	d.mu.Unlock()
}

// bulkThreshold is how many namespaces made or removed at once make the
// agent stop listening while it works (quiet). The kernel walks every
// namespace id of the node for each notification of another namespace a
// listener may hear (rtnl.Listener.Pause), about 50 per router made:
// beside a listener, making N routers costs O(N²) (docs/PERFORMANCE.md).
// A single change keeps listening.
const bulkThreshold = 32

// quietSettle is how long after the last quiet spell everything is
// checked: a failover or a large apply arrives as many reconciles, and
// the check (a second up of every namespace of the node) is paid once.
const quietSettle = 2 * time.Second

// quiet stops hearing the kernel until the returned func is called, which
// listens again and, once no quiet spell has begun for quietSettle, asks
// for everything to be checked: drift meanwhile went unheard. Pins
// removed are still heard (inotify).
func (d *driftWatch) quiet() (resume func()) {
	d.mu.Lock()
	if d.settle != nil {
		d.settle.Stop()
	}
	d.mu.Unlock()
	if err := d.nl.Pause(); err != nil {
		d.markAll()
		return func() {}
	}
	return func() {
		if err := d.nl.Resume(); err != nil {
			d.markAll()
			return
		}
		d.mu.Lock()
		d.settle = time.AfterFunc(quietSettle, d.markAll)
		d.mu.Unlock()
	}
}

// learn maps a namespace's host veth names and namespace id.
func (d *driftWatch) learn(ns string, hostVeths []string, nsid int32) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, h := range hostVeths {
		d.byHost[h] = ns
	}
	if nsid >= 0 {
		d.byNsid[nsid] = ns
	}
}

func (d *driftWatch) mark(ns string) {
	d.mu.Lock()
	d.pending[ns] = true
	d.mu.Unlock()
	select {
	case d.notify <- struct{}{}:
	default:
	}
}

// requeue marks names to be checked again: a bring-up that gave way to a
// change hands back what it did not reach.
func (d *driftWatch) requeue(names []string) {
	d.mu.Lock()
	for _, n := range names {
		d.pending[n] = true
	}
	d.mu.Unlock()
	select {
	case d.notify <- struct{}{}:
	default:
	}
}

func (d *driftWatch) markAll() {
	d.mu.Lock()
	d.unknown = true
	d.mu.Unlock()
	select {
	case d.notify <- struct{}{}:
	default:
	}
}

// take returns the namespaces marked since the last call, and whether
// everything must be checked.
func (d *driftWatch) take() (map[string]bool, bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	p, all := d.pending, d.unknown
	d.pending, d.unknown = map[string]bool{}, false
	return p, all
}

// run reads both sources until ctx ends.
func (d *driftWatch) run(ctx context.Context) {
	in, nl := d.fds[0], d.nl
	buf := make([]byte, 1<<16)
	fds := []unix.PollFd{{Fd: int32(in), Events: unix.POLLIN}, {Fd: int32(nl.Fd()), Events: unix.POLLIN}}
	for ctx.Err() == nil {
		n, err := unix.Poll(fds, 250)
		if err != nil && !errors.Is(err, unix.EINTR) {
			return
		}
		if n <= 0 {
			continue
		}
		if fds[0].Revents&unix.POLLIN != 0 {
			if m, err := unix.Read(in, buf); err == nil {
				d.inotifyEvents(buf[:m])
			}
		}
		if fds[1].Revents&unix.POLLIN != 0 {
			if nl.Read(d.event) {
				d.markAll()
			}
		}
	}
}

func (d *driftWatch) inotifyEvents(b []byte) {
	for len(b) >= unix.SizeofInotifyEvent {
		nameLen := int(binary.NativeEndian.Uint32(b[12:16]))
		end := unix.SizeofInotifyEvent + nameLen
		if end > len(b) {
			return
		}
		name := string(b[unix.SizeofInotifyEvent:end])
		for i := 0; i < len(name); i++ {
			if name[i] == 0 {
				name = name[:i]
				break
			}
		}
		if name != "" && filepath.Base(name) == name {
			d.mark(name)
		}
		b = b[end:]
	}
}

// event marks the namespace a kernel notification is about.
func (d *driftWatch) event(ev rtnl.Event) {
	if ev.NsID >= 0 {
		d.mu.Lock()
		ns, ok := d.byNsid[ev.NsID]
		d.mu.Unlock()
		if ok {
			d.mark(ns)
		}
		// An unmapped id is a namespace created since the last learn
		// (ours, being made) or someone else's: not drift.
		return
	}
	// The host's own: a link event names the host veth.
	if ev.LinkName == "" {
		return
	}
	d.mu.Lock()
	ns, ok := d.byHost[ev.LinkName]
	if ok && ev.PeerNsID >= 0 {
		d.byNsid[ev.PeerNsID] = ns
	}
	d.mu.Unlock()
	if ok {
		d.mark(ns)
	}
}
