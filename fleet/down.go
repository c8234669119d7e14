package fleet

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nsfleet/nsfleet/internal/pool"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
)

// Selector chooses namespaces by exact names (from a spec) or by prefix.
type Selector struct {
	Names  []string
	Prefix string
}

func (s Selector) match(pins []netns.PinInfo) []netns.PinInfo {
	var out []netns.PinInfo
	if s.Names != nil {
		want := make(map[string]bool, len(s.Names))
		for _, n := range s.Names {
			want[n] = true
		}
		for _, p := range pins {
			if want[p.Name] {
				out = append(out, p)
			}
		}
		return out
	}
	for _, p := range pins {
		if strings.HasPrefix(p.Name, s.Prefix) {
			out = append(out, p)
		}
	}
	return out
}

// DownOptions tune Down beyond Options.
type DownOptions struct {
	// Wait for the kernel to finish: host-side veths gone and namespaces
	// freed. Timeout bounds the wait (0: 60 s).
	Wait    bool
	Timeout time.Duration
}

// DownReport says what Down did and how long the kernel took.
type DownReport struct {
	Summary
	Unpinned    time.Duration // when every pin was gone
	LinksGone   time.Duration // when the last host-side veth was gone
	Freed       time.Duration // when the kernel had freed the namespaces
	Waited      bool
	Pending     []string // still there at the timeout
	HostVeths   int      // host-side veths that went with the namespaces
	StaleRemove int      // pin files without a namespace, removed
}

// unpinners is how many goroutines unpin at once (see Down). Unpinning
// holds no descriptor (umount and unlink by path), so the limit does not
// bound it.
const unpinners = 16

type target struct {
	name  string
	veths map[int]string // host-side veths paired into it
}

// Down deletes the selected namespaces in bulk. It first checks every one
// (nsfleet's own, unless Adopt), then detaches and removes all the pins, so
// the kernel can free them in large batches; it never deletes veths one by
// one (each would wait for an RCU grace period). With Wait it returns when
// the kernel has finished, or reports what is pending at the timeout.
func Down(ctx context.Context, sel Selector, opts Options, dopts DownOptions) (DownReport, error) {
	opts = opts.withDefaults()
	rd := opts.RunDir
	all, err := rd.List()
	if err != nil {
		return DownReport{}, fmt.Errorf("down: %w", err)
	}
	pins := sel.match(all)
	if len(pins) > 0 && !opts.DryRun && rd.ReadOnly() {
		// Unmounting would work but removing the files would not: refuse
		// before anything, rather than leave pin files without mounts.
		return DownReport{}, fmt.Errorf("down: run dir %s is on a read-only filesystem: nothing deleted", rd.Path)
	}
	host, err := rtnl.Open()
	if err != nil {
		return DownReport{}, fmt.Errorf("down: %w", err)
	}
	defer host.Close()
	hostLinks, err := host.Links()
	if err != nil {
		return DownReport{}, fmt.Errorf("down: host: %w", err)
	}
	byNsID := map[int]map[int]string{}
	for _, l := range hostLinks {
		if l.Type == "veth" && l.PeerNsID >= 0 {
			if byNsID[l.PeerNsID] == nil {
				byNsID[l.PeerNsID] = map[int]string{}
			}
			byNsID[l.PeerNsID][l.Index] = l.Name
		}
	}

	t := newTally(len(pins), opts.Mark, opts.OnResult)
	var rep DownReport
	// First check every namespace (nsfleet's own, unless Adopt) and note its
	// host veths: cheap, since the host is asked about each lo by nsid.
	targets := make([]*target, len(pins))
	var stale atomic.Int64
	// The checks mostly wait in the kernel: more workers than CPUs help
	// (5,000 routers: pins gone at 0.98 s with 2, 0.77 s with 4 or 8).
	checkers := opts.Workers
	if checkers <= 0 {
		checkers = min(4*DefaultWorkers(), 16)
	}
	parallel(ctx, min(checkers, max(len(pins), 1)), len(pins), func(c *rtnl.Conn, i int) {
		p := pins[i]
		fail := func(a Action, err error) {
			t.add(Result{Name: p.Name, Action: a, Err: &Error{Op: "down", Namespace: p.Name, Err: err}})
		}
		switch {
		case p.Symlink:
			fail(Failed, fmt.Errorf("pin %s: %w", rd.PinPath(p.Name), netns.ErrSymlink))
			return
		case !p.Mounted && p.Mounts > 0:
			fail(Failed, fmt.Errorf("pin %s: something other than a namespace is mounted on it", rd.PinPath(p.Name)))
			return
		case !p.Mounted:
			// A pin file with no namespace: what a crash between create and
			// mount leaves. Removing it is what `ip netns del` would do.
			if opts.DryRun {
				t.add(Result{Name: p.Name, Action: "would delete"})
				return
			}
			if err := rd.Unpin(p.Name); err != nil {
				fail(Failed, err)
				return
			}
			stale.Add(1)
			t.add(Result{Name: p.Name, Action: Deleted, Fixes: []string{"removed pin file with no namespace"}})
			return
		}
		tg, err := check(rd, c, p.Name, byNsID, opts.Adopt)
		if err != nil {
			if errors.Is(err, ErrForeign) {
				fail(Skipped, err)
			} else {
				fail(Failed, err)
			}
			return
		}
		if opts.DryRun {
			t.add(Result{Name: p.Name, Action: "would delete"})
			return
		}
		// Its supervised processes go first: they hold the namespace.
		if err := opts.store().StopAll(p.Name, opts.grace()); err != nil {
			fail(Failed, err)
			return
		}
		targets[i] = tg
	})
	// The sentinels that will prove the kernel finished are made now, so
	// that releasing them right after the last unpin costs nothing.
	var sents []*sentinel
	if dopts.Wait && !opts.DryRun {
		for k := 0; k < 2; k++ {
			sn, err := newSentinel(host, k)
			if err != nil {
				return DownReport{}, fmt.Errorf("down: %w", err)
			}
			defer sn.release()
			sents = append(sents, sn)
		}
	}
	// Then unpin them all at once. Each unmount waits for an expedited RCU
	// grace period (namespace_unlock); waiters that overlap share one, so
	// many unpinners, mostly asleep, finish far sooner than a few.
	var live []*target
	for _, tg := range targets {
		if tg != nil {
			live = append(live, tg)
		}
	}
	var unpinned atomic.Int64
	var progMu sync.Mutex
	progress := func(phase string, done, total int) {
		if opts.OnProgress != nil {
			progMu.Lock()
			opts.OnProgress(phase, done, total)
			progMu.Unlock()
		}
	}
	pool.Each(ctx, len(live), unpinners, func(i int) {
		tg := live[i]
		defer func() { progress("delete", int(unpinned.Add(1)), len(live)) }()
		if err := rd.Unpin(tg.name); err != nil {
			t.add(Result{Name: tg.name, Action: Failed, Err: &Error{Op: "down", Namespace: tg.name, Err: err}})
			live[i] = nil
			return
		}
		opts.store().Forget(tg.name)
		t.add(Result{Name: tg.name, Action: Deleted})
	})
	rep.StaleRemove = int(stale.Load())
	rep.Unpinned = time.Since(t.start)

	// Then wait for the kernel.
	if dopts.Wait && !opts.DryRun && ctx.Err() == nil {
		timeout := dopts.Timeout
		if timeout <= 0 {
			timeout = 60 * time.Second
		}
		deadline := t.start.Add(rep.Unpinned + timeout)
		wctx, cancel := context.WithDeadline(ctx, deadline)
		defer cancel()
		veths := map[int]string{}
		owner := map[int]string{}
		for _, tg := range live {
			if tg == nil {
				continue
			}
			for idx, name := range tg.veths {
				veths[idx] = name
				owner[idx] = tg.name
			}
		}
		rep.HostVeths = len(veths)
		rep.Waited = true
		// Watch our veths go, and meanwhile run the sentinel barrier.
		type polled struct {
			left map[int]string
			err  error
			at   time.Duration
		}
		progress("wait", 0, len(veths))
		pc := make(chan polled, 1)
		go func() {
			c, err := rtnl.Open()
			if err != nil {
				pc <- polled{left: veths, err: err}
				return
			}
			defer c.Close()
			left, err := waitLinksGone(wctx, c, veths, func(n int) { progress("wait", len(veths)-n, len(veths)) })
			pc <- polled{left, err, time.Since(t.start)}
		}()
		berr := freeBarrier(wctx, host, sents)
		freedAt := time.Since(t.start)
		pr := <-pc
		rep.LinksGone = pr.at
		switch {
		case pr.err != nil:
			seen := map[string]bool{}
			for idx, name := range pr.left {
				if !seen[owner[idx]] {
					seen[owner[idx]] = true
					rep.Pending = append(rep.Pending, fmt.Sprintf("%s (host veth %s still present: a process or mount still holds the namespace)", owner[idx], name))
				}
			}
			if len(rep.Pending) == 0 {
				rep.Pending = append(rep.Pending, fmt.Sprintf("could not watch the host veths: %v", pr.err))
			}
			sort.Strings(rep.Pending)
		case berr != nil:
			rep.Pending = append(rep.Pending, fmt.Sprintf("kernel cleanup not finished: %v", berr))
		default:
			rep.Freed = max(freedAt, pr.at)
		}
	}
	rep.Summary = t.finish(ctx.Err() != nil)
	return rep, nil
}

// parallel runs fn(c, i) for i in [0,n) on at most w workers (fewer if
// the descriptor limit says so, see package pool), each with its own host
// netlink socket, until done or ctx is cancelled. fn copes with a nil
// socket: it only loses the host-side bookkeeping.
func parallel(ctx context.Context, w, n int, fn func(c *rtnl.Conn, i int)) {
	w = pool.Fit(w, fdsPerChecker)
	pool.Run(ctx, n, w, func() (*rtnl.Conn, error) {
		c, err := pool.RetryValue(rtnl.Open)
		if err != nil {
			return nil, nil
		}
		return c, nil
	}, (*rtnl.Conn).Close, fn)
}

// fdsPerChecker is what one parallel worker holds at most at once: its host
// socket pair, a pin, and inside the namespace its own handle and socket.
const fdsPerChecker = 6

// check opens a pinned namespace, makes sure it is nsfleet's (or adopt),
// and returns it with its host veths. It asks the host about the
// namespace's lo by nsid when it has one, so it need not enter it.
func check(rd *netns.RunDir, c *rtnl.Conn, name string, byNsID map[int]map[int]string, adopt bool) (*target, error) {
	h, err := rd.Open(name)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	tg := &target{name: name}
	id := -1
	if c != nil {
		if id, err = c.NsID(h.Fd()); err != nil {
			id = -1
		}
	}
	if id >= 0 {
		tg.veths = byNsID[id]
	}
	if adopt {
		return tg, nil
	}
	owned, asked := false, false
	if c != nil && id >= 0 {
		if lo, err := c.LinkInNamespace(id, rtnl.LoopbackIndex); err == nil {
			owned, asked = lo.Alias == Marker, true
		}
	}
	if !asked {
		if owned, err = IsOwned(h); err != nil {
			return nil, err
		}
	}
	if !owned {
		return nil, ErrForeign
	}
	return tg, nil
}

// IsOwned reports whether the namespace's lo carries the Marker, that is,
// whether nsfleet made (or adopted) it.
func IsOwned(h *netns.NS) (bool, error) {
	var owned bool
	err := rtnl.Inside(h, rtnl.OpenLite, func(in *rtnl.Conn) error {
		lo, err := in.LinkByIndex(rtnl.LoopbackIndex)
		owned = err == nil && lo.Alias == Marker
		return err
	})
	return owned, err
}

// waitLinksGone polls the host's links until none of veths (ifindex -> name)
// is left. On timeout it returns those still there.
func waitLinksGone(ctx context.Context, host *rtnl.Conn, veths map[int]string, onPoll func(left int)) (map[int]string, error) {
	left := veths
	// Each poll is a dump of every host link: with tens of thousands of
	// links it costs CPU that the kernel's cleanup needs, so poll gently.
	for delay := 2 * time.Millisecond; ; delay = min(delay*2, 100*time.Millisecond) {
		if len(left) == 0 {
			return nil, nil
		}
		links, err := host.Links()
		if err != nil {
			return left, err
		}
		now := make(map[int]string)
		for _, l := range links {
			if name, ok := left[l.Index]; ok && name == l.Name {
				now[l.Index] = name
			}
		}
		left = now
		if onPoll != nil {
			onPoll(len(left))
		}
		if len(left) == 0 {
			return nil, nil
		}
		select {
		case <-ctx.Done():
			return left, ctx.Err()
		case <-time.After(delay):
		}
	}
}

// sentinel is a throwaway namespace with a veth whose host end shows when
// the kernel has cleaned the namespace up.
type sentinel struct {
	ns    *netns.NS
	name  string
	index int
}

func newSentinel(host *rtnl.Conn, k int) (*sentinel, error) {
	name := fmt.Sprintf("nsfb%d-%d", os.Getpid()%10000000, k)
	h, err := netns.Create(func(inside *netns.NS) error {
		return host.AddVeth(rtnl.VethPair{Host: name, Peer: "p", PeerNsFd: inside.Fd()})
	})
	if err != nil {
		return nil, fmt.Errorf("sentinel: %w", err)
	}
	l, err := host.LinkByName(name)
	if err != nil {
		h.Close()
		return nil, fmt.Errorf("sentinel: %w", err)
	}
	return &sentinel{ns: h, name: name, index: l.Index}, nil
}

// release drops the sentinel's last reference: it is queued for cleanup.
func (s *sentinel) release() { s.ns.Close() }

// freeBarrier returns once the kernel has freed every network namespace
// released before it was called. Namespaces are freed by cleanup_net, which
// runs on an ordered (single-threaded) workqueue and takes all queued
// namespaces as one batch: devices are unregistered, then, after an RCU
// barrier, the namespaces are freed. The first sentinel, released now, is
// cleaned up in the current batch or a later one; once its host veth is
// gone, every earlier batch is complete and the current one has unregistered
// its devices. The second, released after that, proves the first one's batch
// (which may hold ours) ran to the end.
func freeBarrier(ctx context.Context, host *rtnl.Conn, sents []*sentinel) error {
	for _, s := range sents {
		s.release()
		if _, err := waitLinksGone(ctx, host, map[int]string{s.index: s.name}, nil); err != nil {
			if errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("sentinel %s not cleaned up in time", s.name)
			}
			return err
		}
	}
	return nil
}
