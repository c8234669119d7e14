package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/internal/pool"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/process"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
	"github.com/nsfleet/nsfleet/sysctl"
	"golang.org/x/sys/unix"
)

// Up makes the machine match f: it creates the namespaces that are missing,
// repairs those that drifted, and leaves the rest alone. It returns an error
// only when it could not start (run dir, lock); per-namespace failures are
// in the Summary (see Summary.Err). The caller holds the run dir's Lock.
func Up(ctx context.Context, f *spec.Fleet, opts UpOptions) (Summary, error) {
	opts.Options = opts.Options.withDefaults()
	log := opts.log()
	rd := opts.RunDir
	if !opts.DryRun {
		did, err := rd.Setup()
		if err != nil {
			return Summary{}, fmt.Errorf("up: %w", err)
		}
		log.Debug(did)
	}
	pins, err := pinMap(rd, f)
	if err != nil {
		return Summary{}, fmt.Errorf("up: %w", err)
	}
	snap, err := hostSnapshot(f, opts.Previous)
	if err != nil {
		return Summary{}, fmt.Errorf("up: %w", err)
	}
	defer func() { snap.close() }()
	if dyingPeers(f, pins, snap) {
		// A host name we must create is held by a veth whose other end is
		// in some other namespace: typically one that a killed nsfleet
		// left unpinned, which the kernel has not freed yet (freeing is
		// asynchronous). Wait for the kernel's pending cleanup, then look
		// again; what is still there is a real conflict.
		log.Debug("waiting for the kernel to finish freeing namespaces")
		if err := waitFreed(ctx, 10*time.Second); err != nil {
			log.Debug("wait for freeing", "err", err)
		}
		snap.close()
		if snap, err = hostSnapshot(f, opts.Previous); err != nil {
			return Summary{}, fmt.Errorf("up: %w", err)
		}
	}

	t := newTally(len(f.Namespaces), opts.Mark, opts.OnResult)
	nw := pool.Fit(opts.workers(len(f.Namespaces)), fdsPerUpWorker)
	open := func() (*worker, error) { return newWorker(rd, snap, &opts) }
	// A linked namespace is tallied after the links (see links.go).
	lp := &linkPhases{f: f, opts: &opts, t: t}
	linked := func(ns *spec.Namespace) bool { return false }
	if len(f.Links) > 0 {
		lp.held, lp.existing = make([]Result, len(f.Namespaces)), make([]bool, len(f.Namespaces))
		linked = func(ns *spec.Namespace) bool { return len(ns.Links) > 0 }
	}
	setupErr := pool.Run(ctx, len(f.Namespaces), nw, open, (*worker).close, func(w *worker, i int) {
		ns := &f.Namespaces[i]
		pin := pins[ns.Name]
		if linked(ns) && pin != nil && pin.State() == netns.PinNamespace {
			lp.existing[i] = true // repaired in phase 3
			lp.progress("namespaces", len(f.Namespaces))
			return
		}
		r := w.up(ns, pin)
		if r.Err != nil {
			log.Debug(string(r.Action), "namespace", ns.Name, "err", r.Err)
		} else {
			log.Debug(string(r.Action), "namespace", ns.Name, "steps", strings.Join(r.Fixes, "; "))
		}
		if linked(ns) {
			lp.held[i] = r
			lp.progress("namespaces", len(f.Namespaces))
			return
		}
		if len(f.Links) > 0 {
			lp.progress("namespaces", len(f.Namespaces))
		}
		t.add(r)
	})
	if setupErr == nil && len(f.Links) > 0 && ctx.Err() == nil {
		setupErr = lp.run(ctx, rd, nw, open)
	}
	lp.tallyRest()
	if n := netns.ThreadsDiscarded(); n > 0 {
		log.Debug("threads discarded after namespace work (normal inside a user namespace)", "count", n)
	}
	if setupErr != nil {
		return t.finish(false), fmt.Errorf("up: %w", setupErr)
	}
	return t.finish(ctx.Err() != nil), nil
}

// fewNamespaces is where Up stops reading the machine-wide tables (every
// mount, every host address) and asks about its namespaces one by one:
// the agent's reconcile of one changed router on a node of 13,000 spent
// 200 ms reading mountinfo and the host's addresses (docs/PERFORMANCE.md).
var fewNamespaces = 64

// pinMap returns the pins of f's namespaces (others may be listed too).
func pinMap(rd *netns.RunDir, f *spec.Fleet) (map[string]*netns.PinInfo, error) {
	if len(f.Namespaces) <= fewNamespaces {
		m := make(map[string]*netns.PinInfo, len(f.Namespaces))
		for i := range f.Namespaces {
			pi, found, err := rd.Lookup(f.Namespaces[i].Name)
			if err != nil {
				return nil, err
			}
			if found {
				m[pi.Name] = &pi
			}
		}
		return m, nil
	}
	list, err := rd.List()
	if err != nil {
		return nil, err
	}
	m := make(map[string]*netns.PinInfo, len(list))
	for i := range list {
		m[list[i].Name] = &list[i]
	}
	return m, nil
}

// dyingPeers reports whether a namespace to be created has a host name held
// by a veth paired into another namespace (one being freed has already lost
// its id, so the id is not asked for: only that the peer is elsewhere).
// Only names that exist are asked about over rtnetlink, one by one: the
// rare case (a killed run, a conflict) pays the peer lookup, not every run.
func dyingPeers(f *spec.Fleet, pins map[string]*netns.PinInfo, snap *snapshot) bool {
	var c *rtnl.Conn
	defer func() {
		if c != nil {
			c.Close()
		}
	}()
	for i := range f.Namespaces {
		ns := &f.Namespaces[i]
		if p := pins[ns.Name]; p != nil && p.Mounted {
			continue
		}
		for _, v := range ns.Veths {
			if _, ok, _ := snap.dev.Index(v.Host); !ok {
				continue
			}
			if c == nil {
				var err error
				if c, err = rtnl.OpenLite(); err != nil {
					return false
				}
			}
			if l, err := c.LinkByName(v.Host); err == nil && l.Type == "veth" && l.PeerElsewhere {
				return true
			}
		}
	}
	return false
}

func waitFreed(ctx context.Context, timeout time.Duration) error {
	host, err := rtnl.Open()
	if err != nil {
		return err
	}
	defer host.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var sents []*sentinel
	for k := 0; k < 2; k++ {
		s, err := newSentinel(host, k)
		if err != nil {
			return err
		}
		defer s.release()
		sents = append(sents, s)
	}
	dev, err := rtnl.OpenDevices()
	if err != nil {
		return err
	}
	defer dev.Close()
	return freeBarrier(ctx, dev, sents)
}

// fdsPerUpWorker is what one Up worker holds at most at once: its host
// socket pair and procfs; while creating, its own namespace, the new one
// and a socket pair inside; the pin and its mount tree; while starting a
// process, its log, /dev/null, the exec pipe and a pidfd.
const fdsPerUpWorker = 14

// worker owns one host netlink socket and one private procfs.
type worker struct {
	rd      *netns.RunDir
	snap    *snapshot
	opts    *UpOptions
	host    *rtnl.Conn
	sysctls *sysctl.Procfs
}

func newWorker(rd *netns.RunDir, snap *snapshot, opts *UpOptions) (*worker, error) {
	host, err := rtnl.Open() // both wait out EMFILE themselves
	if err != nil {
		return nil, err
	}
	pfs, err := sysctl.Open()
	if err != nil {
		host.Close()
		return nil, err
	}
	return &worker{rd: rd, snap: snap, opts: opts, host: host, sysctls: pfs}, nil
}

func (w *worker) close() {
	w.host.Close()
	w.sysctls.Close()
}

func (w *worker) up(ns *spec.Namespace, pin *netns.PinInfo) Result {
	fail := func(err error) Result {
		return Result{Name: ns.Name, Action: Failed, Err: &Error{Op: "up", Namespace: ns.Name, Err: err}}
	}
	if pin != nil {
		switch pin.State() {
		case netns.PinSymlink:
			return fail(fmt.Errorf("pin %s: %w", w.rd.PinPath(ns.Name), netns.ErrSymlink))
		case netns.PinNamespace:
			return w.repair(ns)
		case netns.PinOtherMount:
			return fail(fmt.Errorf("pin %s: something other than a namespace is mounted on it", w.rd.PinPath(ns.Name)))
		}
	}
	// Missing, or a pin file left without its mount: create. A host name
	// in the way is found by the kernel (EEXIST) and explained then: a
	// lookup beforehand would walk a name-hash chain per veth for nothing.
	if w.opts.DryRun {
		for _, v := range ns.Veths {
			if c := w.hostNameTaken(v); c != nil {
				return fail(c)
			}
		}
		return Result{Name: ns.Name, Action: WouldCreate, Fixes: describeCreate(ns)}
	}
	if err := w.create(ns); err != nil {
		if errors.Is(err, unix.EEXIST) {
			for _, v := range ns.Veths {
				if c := w.hostNameTaken(v); c != nil {
					return fail(c)
				}
			}
		}
		return fail(err)
	}
	return Result{Name: ns.Name, Action: Created, Fixes: describeCreate(ns)}
}

// hostNameTaken explains a host veth name held by another link.
func (w *worker) hostNameTaken(v spec.Veth) *Conflict {
	if _, taken, err := w.snap.dev.Index(v.Host); err != nil || !taken {
		return nil
	}
	kind := ""
	if l, err := w.host.LinkByName(v.Host); err == nil {
		kind = " (type " + l.Type + ")"
	}
	return &Conflict{Reason: fmt.Sprintf("veth %s/%s: host interface %s already exists%s and is not this new namespace's", v.Host, v.Peer, v.Host, kind)}
}

// startProcesses starts the namespace's processes that are not running,
// restarts those started from another spec, and stops those that prev had
// and ns no longer has. It returns what it did.
func (w *worker) startProcesses(h *netns.NS, ns, prev *spec.Namespace) ([]string, error) {
	var did []string
	store := w.opts.store()
	if prev != nil {
		for _, p := range prev.Processes {
			if slices.ContainsFunc(ns.Processes, func(q spec.Process) bool { return q.Name == p.Name }) {
				continue
			}
			if w.opts.DryRun {
				did = append(did, "stop process "+p.Name)
				continue
			}
			if err := store.Remove(ns.Name, p.Name, w.opts.grace()); err != nil {
				return did, fmt.Errorf("process %s: %w", p.Name, err)
			}
			did = append(did, "stopped process "+p.Name+" (no longer in the spec)")
		}
	}
	for _, p := range ns.Processes {
		rec, err := store.Load(ns.Name, p.Name)
		if err != nil {
			return did, err
		}
		if rec != nil && rec.Launching {
			continue // being launched by another nsfleet right now
		}
		changed := process.Alive(rec) && process.Changed(rec, p)
		if process.Alive(rec) && !changed {
			continue
		}
		if w.opts.DryRun {
			did = append(did, "start process "+p.Name)
			continue
		}
		restarts := 0
		if rec != nil {
			restarts = rec.Restarts
		}
		if changed {
			// Marked stopped first, so that a supervisor does not start
			// the old one again.
			if err := store.Stop(rec, w.opts.grace()); err != nil {
				return did, fmt.Errorf("process %s: %w", p.Name, err)
			}
			did = append(did, "stopped process "+p.Name+" (its spec changed)")
		}
		r, cmd, err := store.Launch(h, ns.Name, p, restarts)
		if err != nil {
			return did, err
		}
		// up does not wait for its daemons: let go of Go's handle (a
		// pidfd each) at once, or a large fleet runs out of descriptors.
		cmd.Process.Release()
		did = append(did, fmt.Sprintf("started process %s (pid %d)", p.Name, r.PID))
	}
	return did, nil
}

func describeCreate(ns *spec.Namespace) []string {
	out := []string{"lo " + upDown(ns.Loopback)}
	for _, v := range ns.Veths {
		out = append(out, "veth "+v.Host+"/"+v.Peer)
	}
	for _, s := range ns.Sysctls {
		out = append(out, "sysctl "+s.Key+"="+s.Value)
	}
	for _, r := range ns.Routes {
		out = append(out, "route "+r.To.String()+" "+via(r))
	}
	for _, p := range ns.Processes {
		out = append(out, "process "+p.Name)
	}
	return out
}

// create builds the namespace completely, then pins it. Until the pin, the
// namespace lives only through the handle: on any error (or a crash) the
// kernel frees it and its veths.
func (w *worker) create(ns *spec.Namespace) error {
	if err := w.sysctls.NextNamespace(); err != nil {
		return err
	}
	sw := newStopwatch(w.opts.Steps != nil)
	defer w.opts.Steps.add(sw)
	h, err := netns.Create(func(inside *netns.NS) error {
		sw.lap(StepUnshare)
		open := rtnl.OpenLite // one socket: enough for lo and plain veths
		if needsFullConn(ns) {
			open = rtnl.Open
		}
		in, err := open()
		if err != nil {
			return err
		}
		defer in.Close()
		if err := in.SetLoopback(ns.Loopback, Marker); err != nil {
			return err
		}
		for _, a := range ns.LoopbackAddrs {
			if err := in.AddAddr(rtnl.LoopbackIndex, a); err != nil {
				return fmt.Errorf("lo: %w", err)
			}
		}
		sw.lap(StepLo)
		for _, v := range ns.Veths {
			if err := w.addVeth(in, inside, v); err != nil {
				return err
			}
		}
		for _, b := range ns.Bridges {
			if err := addBridge(in, b); err != nil {
				return err
			}
		}
		sw.lap(StepVeth)
		for _, s := range ns.Sysctls {
			if err := w.sysctls.Write(s.Key, s.Value); err != nil {
				return err
			}
		}
		sw.lap(StepSysctl)
		if len(ns.Links) > 0 {
			return nil // routes may need the links: see finish
		}
		for _, r := range ns.Routes {
			if err := addRoute(in, r); err != nil {
				return err
			}
		}
		sw.lap(StepRoute)
		return nil
	})
	sw.lap(StepBack)
	if err != nil {
		return err
	}
	defer h.Close()
	err = w.rd.Pin(ns.Name, h)
	sw.lap(StepPin)
	if err != nil || len(ns.Links) > 0 {
		return err // a linked namespace's processes start in finish
	}
	_, err = w.startProcesses(h, ns, nil)
	return err
}

// addBridge creates a bridge with its MTU and addresses, enslaves the
// ports that exist (a link's end is made after the namespace: see
// finish) and sets it up.
func addBridge(in *rtnl.Conn, b spec.Bridge) error {
	if err := in.AddBridge(b.Name, b.MTU); err != nil {
		return err
	}
	idx, err := bridgeIndex(in, b)
	if err != nil {
		return err
	}
	for _, a := range b.Addrs {
		if err := in.AddAddr(idx, a); err != nil {
			return fmt.Errorf("bridge %s: %w", b.Name, err)
		}
	}
	if err := enslavePorts(in, b, idx); err != nil {
		return err
	}
	if b.Up {
		if err := in.SetUp(idx, true); err != nil {
			return fmt.Errorf("bridge %s: %w", b.Name, err)
		}
	}
	return nil
}

// needsFullConn reports whether creating ns needs more than raw writes
// inside it: lookups for addresses, link state and routes.
// needsFullObserve reports whether reading ns's state needs a full Conn
// (addresses or routes), or one socket (OpenLite) will do.
func needsFullObserve(ns *spec.Namespace) bool {
	return len(ns.Routes) > 0 || needsAddrs(ns, nil)
}

func needsFullConn(ns *spec.Namespace) bool {
	if len(ns.Routes) > 0 || needsAddrs(ns, nil) {
		return true
	}
	for _, v := range ns.Veths {
		if v.Up || len(v.PeerAddrs) > 0 || len(v.HostAddrs) > 0 {
			return true
		}
	}
	return false
}

// addVeth creates the pair with its peer directly inside the namespace, then
// sets it up and addresses it as the spec says.
func (w *worker) addVeth(in *rtnl.Conn, inside *netns.NS, v spec.Veth) error {
	if err := w.host.AddVeth(rtnl.VethPair{Host: v.Host, Peer: v.Peer, MTU: v.MTU, PeerNsFd: inside.Fd()}); err != nil {
		return err
	}
	if v.HostIPv6Off {
		if err := w.snap.setHostIPv6Off(v.Host); err != nil {
			return fmt.Errorf("veth %s/%s: %w", v.Host, v.Peer, err)
		}
	}
	if !v.Up && len(v.PeerAddrs) == 0 && len(v.HostAddrs) == 0 {
		return nil
	}
	// By ioctl or sysfs, not LinkByName: rtnetlink's answer about a veth
	// costs the host a scan of its namespace ids, and gives the namespace
	// an id for the host (see rtnl.Survey).
	hostIdx, ok, err := w.snap.dev.Index(v.Host)
	if err == nil && !ok {
		err = unix.ENODEV
	}
	if err != nil {
		return fmt.Errorf("veth %s/%s: %s: %w", v.Host, v.Peer, v.Host, err)
	}
	peerIdx, ok, err := in.Index(v.Peer)
	if err == nil && !ok {
		err = unix.ENODEV
	}
	if err != nil {
		return fmt.Errorf("veth %s/%s: %s: %w", v.Host, v.Peer, v.Peer, err)
	}
	for _, a := range v.HostAddrs {
		if err := w.host.AddAddr(hostIdx, a); err != nil {
			return fmt.Errorf("veth %s: %w", v.Host, err)
		}
	}
	for _, a := range v.PeerAddrs {
		if err := in.AddAddr(peerIdx, a); err != nil {
			return fmt.Errorf("veth %s: %w", v.Peer, err)
		}
	}
	if v.Up {
		if err := w.host.SetUp(hostIdx, true); err != nil {
			return fmt.Errorf("veth %s: %w", v.Host, err)
		}
		if err := in.SetUp(peerIdx, true); err != nil {
			return fmt.Errorf("veth %s: %w", v.Peer, err)
		}
	}
	return nil
}

func bridgeIndex(in *rtnl.Conn, b spec.Bridge) (int, error) {
	idx, ok, err := in.Index(b.Name)
	if err == nil && !ok {
		err = unix.ENODEV
	}
	if err != nil {
		return 0, fmt.Errorf("bridge %s: %w", b.Name, err)
	}
	return idx, nil
}

// enslavePorts makes the ports of b that exist ports of it (idx).
func enslavePorts(in *rtnl.Conn, b spec.Bridge, idx int) error {
	for _, p := range b.Ports {
		pi, ok, err := in.Index(p)
		if err == nil && ok {
			err = in.SetMaster(pi, idx)
		}
		if err != nil {
			return fmt.Errorf("bridge %s port %s: %w", b.Name, p, err)
		}
	}
	return nil
}

func addRoute(in *rtnl.Conn, r spec.Route) error {
	rt := rtnl.Route{To: r.To, Via: r.Via}
	if r.Dev != "" {
		index, ok, err := in.Index(r.Dev)
		if err == nil && !ok {
			err = unix.ENODEV
		}
		if err != nil {
			return fmt.Errorf("route %s: %s: %w", r.To, r.Dev, err)
		}
		rt.Index = index
	}
	return in.ReplaceRoute(rt)
}
