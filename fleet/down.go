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

// DownOptions are Down's.
type DownOptions struct {
	Options
	DryRun bool // say what would be deleted, change nothing
	// Wait for the kernel to finish: host-side veths gone and namespaces
	// freed. Timeout bounds how long the wait may go without progress
	// (0: 60 s): a teardown that keeps freeing never times out, however
	// large; one where nothing moves for Timeout is reported as pending.
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
	Pending     []string // still there when the wait stalled
	HostVeths   int      // host-side veths that went with the namespaces
	StaleRemove int      // pin files without a namespace, removed
}

// unpinners is how many goroutines unpin at once (see Down). Unpinning
// holds no descriptor (umount and unlink by path), so the limit does not
// bound it. Each unmount waits in synchronize_rcu_expedited, and while the
// kernel frees the first namespaces (cleanup_net scans ids under a spin
// lock with bottom halves off) each grace period is long; unmounts waiting
// at once share one. 20,000 routers, same session: pins removed in
// 17.4/23.6 s with 16, 4.9/7.0 s with 256, 5.0 s with 128, 5.4 s with
// 512; the kernel had freed them at 31.1/38.0 s and 27.1/23.5 s.
const unpinners = 256

type target struct {
	name  string
	inode uint64         // of the namespace: the order it was made in
	veths map[int]string // host-side veths paired into it
}

// teardown is the state one Down call shares between its phases.
type teardown struct {
	ctx   context.Context
	opts  DownOptions
	rd    *netns.RunDir
	t     *tally
	host  *rtnl.Conn
	snap  *snapshot
	stale atomic.Int64

	progMu sync.Mutex
}

func (td *teardown) progress(phase string, done, total int) {
	if td.opts.OnProgress != nil {
		td.progMu.Lock()
		td.opts.OnProgress(phase, done, total)
		td.progMu.Unlock()
	}
}

func (td *teardown) fail(name string, a Action, err error) {
	td.t.add(Result{Name: name, Action: a, Err: &Error{Op: "down", Namespace: name, Err: err}})
}

// Down deletes the selected namespaces in bulk, in three phases: check
// every one (nsfleet's own, unless Adopt) and stop its processes; then
// detach and remove all the pins at once, so the kernel can free them in
// large batches (it never deletes veths one by one: each would wait for an
// RCU grace period); then, with Wait, wait until the kernel has finished.
func Down(ctx context.Context, sel Selector, opts DownOptions) (DownReport, error) {
	opts.Options = opts.Options.withDefaults()
	rd := opts.RunDir
	// The host's links are read while the run dir is (see List).
	table := make(chan *rtnl.LinkTable, 1)
	go func() {
		t, _ := rtnl.ReadLinkTable() // nil: host ends are asked about by index
		table <- t
	}()
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
	// One look at the host for the whole teardown: check names the host
	// ends with it, the wait polls them and the sentinels through it.
	snap, err := hostSnapshot(nil, nil)
	if err != nil {
		return DownReport{}, fmt.Errorf("down: %w", err)
	}
	defer snap.close()
	snap.links = <-table
	td := &teardown{ctx: ctx, opts: opts, rd: rd, host: host, snap: snap, t: newTally(len(pins), 0, opts.OnResult)}
	targets, err := td.check(pins)
	if err != nil {
		return DownReport{}, fmt.Errorf("down: %w", err)
	}
	// The sentinels that will prove the kernel finished are made now, so
	// that releasing them right after the last unpin costs nothing.
	var sents []*sentinel
	if opts.Wait && !opts.DryRun {
		for k := 0; k < 2; k++ {
			sn, err := newSentinel(host, k)
			if err != nil {
				return DownReport{}, fmt.Errorf("down: %w", err)
			}
			defer sn.release()
			sents = append(sents, sn)
		}
	}
	// Oldest first. Freeing a namespace drops the id the host has for it
	// (unhash_nsid), found by a walk over the host's ids from the lowest,
	// and ids are handed out lowest-free as namespaces are made: released
	// in the order they were made (namespace inode numbers are handed out
	// the same way), each walk meets few ids still there. By name, the
	// same 40,000 took the kernel 139-232 s to free; in this order 83 s,
	// level with unmounting every pin in a C loop (71-90 s).
	sort.SliceStable(targets, func(i, j int) bool { return targets[i].inode < targets[j].inode })
	live := td.unpin(targets)
	var rep DownReport
	rep.StaleRemove = int(td.stale.Load())
	rep.Unpinned = time.Since(td.t.start)
	if opts.Wait && !opts.DryRun && ctx.Err() == nil {
		td.wait(live, sents, opts.Timeout, &rep)
	}
	rep.Summary = td.t.finish(ctx.Err() != nil)
	return rep, nil
}

// check is Down's first phase: it classifies every pin, removes pin files
// that hold no namespace, makes sure the others are nsfleet's (unless
// Adopt), notes their host veths and stops their processes. It returns the
// namespaces to unpin.
func (td *teardown) check(pins []netns.PinInfo) ([]*target, error) {
	// No dump of the host's links over rtnetlink here: the kernel fills in
	// each host veth's peer namespace id by a scan over every id the host
	// has, so one dump costs veths x namespaces (1.5 s of CPU at 10,000
	// routers, four times that at twice the size). Each namespace tells
	// its veths' peer indexes; the host's names come from ethtool's dump.
	snap := td.snap
	targets := make([]*target, len(pins))
	// The checks mostly wait in the kernel: more workers than CPUs help
	// (5,000 routers: pins gone at 0.98 s with 2, 0.77 s with 4 or 8).
	checkers := td.opts.Workers
	if checkers <= 0 {
		checkers = min(4*DefaultWorkers(), 16)
	}
	rd, opts := td.rd, td.opts
	pool.Each(td.ctx, len(pins), pool.Fit(checkers, fdsPerChecker), func(i int) {
		p := pins[i]
		switch p.State() {
		case netns.PinSymlink:
			td.fail(p.Name, Failed, fmt.Errorf("pin %s: %w", rd.PinPath(p.Name), netns.ErrSymlink))
			return
		case netns.PinOtherMount:
			td.fail(p.Name, Failed, fmt.Errorf("pin %s: something other than a namespace is mounted on it", rd.PinPath(p.Name)))
			return
		case netns.PinStale:
			// A pin file with no namespace: what a crash between create and
			// mount leaves. Removing it is what `ip netns del` would do.
			if opts.DryRun {
				td.t.add(Result{Name: p.Name, Action: WouldDelete})
				return
			}
			if err := rd.Unpin(p.Name); err != nil {
				td.fail(p.Name, Failed, err)
				return
			}
			td.stale.Add(1)
			td.t.add(Result{Name: p.Name, Action: Deleted, Fixes: []string{"removed pin file with no namespace"}})
			return
		}
		tg, err := check(rd, snap, p.Name, opts.Adopt)
		if tg != nil {
			tg.inode = p.Inode
		}
		if err != nil {
			if errors.Is(err, ErrForeign) {
				td.fail(p.Name, Skipped, err)
			} else {
				td.fail(p.Name, Failed, err)
			}
			return
		}
		if opts.DryRun {
			td.t.add(Result{Name: p.Name, Action: WouldDelete})
			return
		}
		// Its supervised processes go first: they hold the namespace.
		if err := opts.store().StopAll(p.Name, opts.grace()); err != nil {
			td.fail(p.Name, Failed, err)
			return
		}
		targets[i] = tg
	})
	var out []*target
	for _, tg := range targets {
		if tg != nil {
			out = append(out, tg)
		}
	}
	return out, nil
}

// unpin is Down's second phase: every pin detached and removed at once.
// Each unmount waits for an expedited RCU grace period (namespace_unlock);
// waiters that overlap share one, so many unpinners, mostly asleep, finish
// far sooner than a few. It returns the namespaces actually unpinned.
func (td *teardown) unpin(targets []*target) []*target {
	var unpinned atomic.Int64
	done := make([]bool, len(targets))
	pool.Each(td.ctx, len(targets), unpinners, func(i int) {
		tg := targets[i]
		defer func() { td.progress("delete", int(unpinned.Add(1)), len(targets)) }()
		if err := td.rd.Unpin(tg.name); err != nil {
			td.fail(tg.name, Failed, err)
			return
		}
		td.opts.store().Forget(tg.name)
		td.t.add(Result{Name: tg.name, Action: Deleted})
		done[i] = true
	})
	var out []*target
	for i, tg := range targets {
		if done[i] {
			out = append(out, tg)
		}
	}
	return out
}

// wait is Down's last phase: it watches the unpinned namespaces' host veths
// go and runs the sentinel barrier, until the kernel has freed them or
// nothing has moved for stall.
func (td *teardown) wait(live []*target, sents []*sentinel, stall time.Duration, rep *DownReport) {
	if stall <= 0 {
		stall = 60 * time.Second
	}
	// In the order they were unpinned, which is about the order the
	// kernel frees them in (cleanup_net takes its queue in batches).
	var veths []hostVeth
	for _, tg := range live {
		idx := make([]int, 0, len(tg.veths))
		for i := range tg.veths {
			idx = append(idx, i)
		}
		sort.Ints(idx)
		for _, i := range idx {
			veths = append(veths, hostVeth{index: i, name: tg.veths[i], owner: tg.name, inode: tg.inode})
		}
	}
	rep.HostVeths = len(veths)
	rep.Waited = true
	// The deadline moves on whenever a veth goes or the kernel drops one
	// of the host's namespace ids (the first step of freeing a namespace:
	// a batch of thousands can take minutes before its devices go): only
	// a stall ends it. Once every veth is gone nothing can stall: a
	// namespace held by a process or a mount keeps its devices.
	wctx, cancel := context.WithCancel(td.ctx)
	defer cancel()
	var lastMove atomic.Int64
	var linksGone atomic.Bool
	lastMove.Store(time.Now().UnixNano())
	go func() {
		err := rtnl.WatchNsIDs(wctx, func() { lastMove.Store(time.Now().UnixNano()) })
		if err != nil {
			td.opts.log().Debug("namespace id announcements", "err", err)
		}
	}()
	go func() {
		for {
			left := stall - time.Since(time.Unix(0, lastMove.Load()))
			if left <= 0 && linksGone.Load() {
				lastMove.Store(time.Now().UnixNano())
				continue
			}
			if left <= 0 {
				cancel()
				return
			}
			select {
			case <-wctx.Done():
				return
			case <-time.After(left):
			}
		}
	}()
	type polled struct {
		left []hostVeth
		err  error
		at   time.Duration
	}
	td.progress("wait", 0, len(veths))
	pc := make(chan polled, 1)
	dev := td.snap.dev
	go func() {
		prev := len(veths)
		left, err := waitLinksGone(wctx, dev, veths, func(n int) {
			if n < prev {
				prev = n
				lastMove.Store(time.Now().UnixNano())
			}
			td.progress("wait", len(veths)-n, len(veths))
		})
		if err == nil {
			linksGone.Store(true)
		}
		pc <- polled{left, err, time.Since(td.t.start)}
	}()
	berr := freeBarrier(wctx, dev, sents)
	freedAt := time.Since(td.t.start)
	pr := <-pc
	rep.LinksGone = pr.at
	switch {
	case pr.err != nil:
		inodes := map[uint64]bool{}
		for _, v := range pr.left {
			inodes[v.inode] = true
		}
		holders := netns.Holders(inodes)
		seen := map[string]bool{}
		for _, v := range pr.left {
			if !seen[v.owner] {
				seen[v.owner] = true
				why := "a process or mount still holds the namespace"
				if h := holders[v.inode]; len(h) > 0 {
					why = "the namespace is held: " + strings.Join(h, ", ")
				}
				rep.Pending = append(rep.Pending, fmt.Sprintf("%s (host veth %s still present: %s)", v.owner, v.name, why))
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

// fdsPerChecker is what one checker (of Down, or reader of List) holds at
// most at once: a pin, the handle on its own namespace while inside, a
// socket pair inside, and a procfs instance.
const fdsPerChecker = 6

// check opens a pinned namespace and, from inside it, makes sure it is
// nsfleet's (or adopt) and finds its host veths, by name and index: the
// host links paired with its veths (snapshot.hostEnd). It reads the
// namespace with rtnl.Survey: a read that gave it an id for the host would
// make the kernel's teardown that follows dearer (at 40,000 routers, 183 s
// to free instead of 65 s: docs/PERFORMANCE.md).
func check(rd *netns.RunDir, snap *snapshot, name string, adopt bool) (*target, error) {
	h, err := rd.Open(name)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	tg := &target{name: name, veths: map[int]string{}}
	var obs Observed
	err = rtnl.Inside(h, rtnl.OpenLite, func(in *rtnl.Conn) error {
		r, err := in.Survey(nil)
		obs.Links = r.Links
		return err
	})
	if err != nil {
		return nil, err
	}
	if !obs.Owned() && !adopt {
		return nil, ErrForeign
	}
	for _, l := range obs.Links {
		if l.Type == "veth" {
			if host := snap.hostEnd(&obs, l); host != "" {
				tg.veths[l.PeerIndex] = host
			}
		}
	}
	return tg, nil
}

// hostVeth is a host end that Down waits for.
type hostVeth struct {
	index int
	name  string
	owner string // the namespace it is paired into
	inode uint64 // the owner's
}

// present reports whether v is still there: a link of its name with its
// index (the name may have been taken by a new link since).
func (v hostVeth) present(dev *rtnl.Devices) (bool, error) {
	index, ok, err := dev.Index(v.name)
	return ok && index == v.index, err
}

// waitLinksGone polls the host ends in veths until none is left, and on
// ctx's end returns those still there. It asks about each by name
// (rtnl.Devices: sysfs, about 4x cheaper than an ioctl on a host of
// 80,000 links, and no rtnetlink, whose every answer about a veth costs a
// scan over the host's namespace ids, which a dump of the host pays per
// veth: at 40,000 routers each dump took seconds of the CPU the kernel's
// cleanup needs). The kernel frees the namespaces about in the order they
// were released, so each poll asks from the first end still there up to
// lookahead more, and every end is found gone about once: the whole wait
// asks O(N) questions.
func waitLinksGone(ctx context.Context, dev *rtnl.Devices, veths []hostVeth, onPoll func(left int)) ([]hostVeth, error) {
	const lookahead = 32
	left := append([]hostVeth(nil), veths...)
	for delay := 2 * time.Millisecond; ; delay = min(delay*2, 100*time.Millisecond) {
		kept := left[:0]
		present := 0
		for i, v := range left {
			if present > lookahead {
				kept = append(kept, left[i:]...)
				break
			}
			there, err := v.present(dev)
			if err != nil {
				return left, err
			}
			if there {
				kept = append(kept, v)
				present++
			}
		}
		left = kept
		if onPoll != nil {
			onPoll(len(left))
		}
		if len(left) == 0 {
			return nil, nil
		}
		select {
		case <-ctx.Done():
			return stillThere(dev, left), ctx.Err()
		case <-time.After(delay):
		}
	}
}

// stillThere asks about every end once more, for the report of a stall.
func stillThere(dev *rtnl.Devices, veths []hostVeth) []hostVeth {
	var out []hostVeth
	for _, v := range veths {
		if there, err := v.present(dev); err != nil || there {
			out = append(out, v)
		}
	}
	return out
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
func freeBarrier(ctx context.Context, dev *rtnl.Devices, sents []*sentinel) error {
	for _, s := range sents {
		s.release()
		if err := s.waitGone(ctx, dev); err != nil {
			if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
				return fmt.Errorf("sentinel %s not cleaned up in time", s.name)
			}
			return err
		}
	}
	return nil
}

// waitGone polls the sentinel's host veth by its index (one ioctl, not
// rtnetlink: see waitLinksGone) until it is gone.
func (s *sentinel) waitGone(ctx context.Context, dev *rtnl.Devices) error {
	for delay := time.Millisecond; ; delay = min(delay*2, 50*time.Millisecond) {
		name, ok, err := dev.NameOf(s.index)
		if err != nil {
			return err
		}
		if !ok || name != s.name {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(delay):
		}
	}
}
