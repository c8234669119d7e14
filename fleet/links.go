package fleet

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/nsfleet/nsfleet/internal/pool"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
	"golang.org/x/sys/unix"
)

// Links between namespaces (spec.Link) are made once both namespaces are
// pinned, so that a link exists only between two pinned namespaces: a
// crash before then frees the unpinned one and takes nothing with it, and
// a crash after leaves a whole veth or none (the kernel makes both ends in
// one request, each directly in its namespace). Up therefore works in
// three phases when a spec has links:
//
//  1. every namespace as without links, except that a linked one that is
//     created gets its routes and processes later (a route may go through
//     a link, a daemon wants its interfaces);
//  2. every link (linkWorker.up), with both namespaces open: made,
//     re-made when its ends are not each other's, and its MTU, state and
//     addresses set;
//  3. the linked namespaces created in phase 1 are finished (bridge ports
//     that are link ends, routes, processes), and those that existed are
//     repaired as usual, which enslaves a re-made port again.

// linkWorker makes links; it keeps one locked thread to enter namespaces
// with (it runs on one pool goroutine).
type linkWorker struct {
	rd     *netns.RunDir
	dryRun bool
	thread *netns.Thread
	host   *rtnl.Conn // in nsfleet's own namespace, for tunnels; opened on first use
}

func newLinkWorker(rd *netns.RunDir, dryRun bool) (*linkWorker, error) {
	t, err := netns.LockThread()
	if err != nil {
		return nil, err
	}
	return &linkWorker{rd: rd, dryRun: dryRun, thread: t}, nil
}

func (w *linkWorker) close() {
	if w.host != nil {
		w.host.Close()
	}
	w.thread.Close()
}

// linkSide is one end of a link as found: the namespace open, a
// connection inside it, and the interface there, if any.
type linkSide struct {
	end   spec.LinkEnd
	ns    *netns.NS
	in    *rtnl.Conn
	link  rtnl.Link
	found bool
}

func (s *linkSide) close() {
	s.in.Close()
	if s.ns != nil {
		s.ns.Close()
	}
}

// open opens the end's namespace and a connection inside it (the socket
// stays in the namespace once the thread is back), checks that the
// namespace is nsfleet's if asked, and looks the interface up.
func (w *linkWorker) open(end spec.LinkEnd, full, owned bool) (*linkSide, error) {
	s := &linkSide{end: end}
	var err error
	if s.ns, err = w.rd.Open(end.Namespace); err != nil {
		return nil, err
	}
	open := rtnl.OpenLite
	if full {
		open = rtnl.Open
	}
	err = w.thread.Do(s.ns, func() error {
		var err error
		s.in, err = open()
		return err
	})
	if err == nil && owned {
		var lo rtnl.Link
		if lo, err = s.in.LinkByIndex(rtnl.LoopbackIndex); err == nil && lo.Alias != Marker {
			err = fmt.Errorf("namespace %s: %w", end.Namespace, ErrForeign)
		}
	}
	if err == nil {
		err = s.lookup()
	}
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *linkSide) lookup() error {
	l, err := s.in.LinkByName(s.end.Interface)
	switch {
	case errors.Is(err, unix.ENODEV):
		s.link, s.found = rtnl.Link{}, false
		return nil
	case err != nil:
		return fmt.Errorf("%s: %w", s.end, err)
	}
	s.link, s.found = l, true
	return nil
}

// up makes one link match the spec and says what it did. Only the two
// interfaces the link names are touched, and only inside namespaces of
// nsfleet's: check names the ends whose namespace this run did not make,
// whose lo must carry the Marker (ErrForeign otherwise).
func (w *linkWorker) up(l *spec.Link, check func(spec.LinkEnd) bool) ([]string, error) {
	full := len(l.A.Addrs)+len(l.B.Addrs) > 0
	a, err := w.open(l.A, full, check(l.A))
	if err != nil {
		return nil, err
	}
	defer a.close()
	b, err := w.open(l.B, full, check(l.B))
	if err != nil {
		return nil, err
	}
	defer b.close()
	var did []string
	if why := paired(a, b); why != "" {
		if w.dryRun {
			return []string{"link " + l.String() + ": " + why}, nil
		}
		if err := w.make(l, a, b); err != nil {
			return nil, err
		}
		did = append(did, "link "+l.String()+": "+why+"; made")
	} else if l.MTU != 0 && (a.link.MTU != l.MTU || b.link.MTU != l.MTU) {
		did = append(did, fmt.Sprintf("link %s: mtu %d/%d, want %d", l, a.link.MTU, b.link.MTU, l.MTU))
		if !w.dryRun {
			for _, s := range []*linkSide{a, b} {
				if err := s.in.SetMTU(s.link.Index, l.MTU); err != nil {
					return did, fmt.Errorf("%s: %w", s.end, err)
				}
			}
		}
	}
	for _, s := range []*linkSide{a, b} {
		d, err := w.finishEnd(l, s)
		did = append(did, d...)
		if err != nil {
			return did, fmt.Errorf("%s: %w", s.end, err)
		}
	}
	return did, nil
}

// paired says why a and b are not the two ends of one veth ("" when they
// are): each names the other as its peer, and a's peer is in b's
// namespace by a's own id for it.
func paired(a, b *linkSide) string {
	switch {
	case !a.found && !b.found:
		return "missing"
	case !a.found || !b.found:
		return "one end missing"
	case a.link.Type != "veth" || b.link.Type != "veth":
		return "an end is not a veth"
	case a.link.PeerIndex != b.link.Index || b.link.PeerIndex != a.link.Index:
		return "the ends are not each other's peers"
	}
	id, err := a.in.NsID(b.ns.Fd())
	if err != nil || id < 0 || id != a.link.PeerNsID {
		return "the ends are not each other's peers"
	}
	return ""
}

// make removes what stands under the link's names and creates the pair:
// a's end in a's namespace, b's made directly in b's.
func (w *linkWorker) make(l *spec.Link, a, b *linkSide) error {
	for _, s := range []*linkSide{a, b} {
		if !s.found {
			continue
		}
		// Deleting one end of a veth deletes the other: b's may be gone.
		if err := s.in.DeleteLink(s.link.Index); err != nil && !errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("%s: %w", s.end, err)
		}
	}
	if err := a.in.AddVeth(rtnl.VethPair{Host: l.A.Interface, Peer: l.B.Interface, MTU: l.MTU, PeerNsFd: b.ns.Fd()}); err != nil {
		return fmt.Errorf("link %s: %w", l, err)
	}
	for _, s := range []*linkSide{a, b} {
		if err := s.lookup(); err != nil {
			return err
		}
		if !s.found {
			return fmt.Errorf("%s: %w after creating it", s.end, unix.ENODEV)
		}
	}
	return nil
}

// finishEnd gives one end its addresses and state.
func (w *linkWorker) finishEnd(l *spec.Link, s *linkSide) ([]string, error) {
	var did []string
	if len(s.end.Addrs) > 0 && s.found {
		have, err := s.in.AddrsOf([]int{s.link.Index})
		if err != nil {
			return nil, err
		}
		for _, p := range s.end.Addrs {
			if slices.Contains(have[s.link.Index], p) {
				continue
			}
			did = append(did, fmt.Sprintf("address %s on %s", p, s.end))
			if !w.dryRun {
				if err := s.in.AddAddr(s.link.Index, p); err != nil {
					return did, err
				}
			}
		}
	}
	if l.Up && s.found && !s.link.Up {
		did = append(did, s.end.String()+" up")
		if !w.dryRun {
			if err := s.in.SetUp(s.link.Index, true); err != nil {
				return did, err
			}
		}
	}
	return did, nil
}

// linkPhases carries out phases 2 and 3 (see the top of this file) for
// the linked namespaces whose phase 1 results are in held (by index in
// f.Namespaces; existing marks those that were pinned already and were
// left for phase 3), and tallies them.
type linkPhases struct {
	f        *spec.Fleet
	opts     *UpOptions
	held     []Result
	existing []bool
	t        *tally
	index    map[string]int // f's namespaces by name

	mu    sync.Mutex // for progress
	phase string
	done  int
}

// progress counts one more done in phase (of total) and tells
// Options.OnProgress: the namespaces of phase 1 (all of them, since the
// linked ones are tallied only at the end) and the links of phase 2.
func (lp *linkPhases) progress(phase string, total int) {
	if lp.opts.OnProgress == nil {
		return
	}
	lp.mu.Lock()
	defer lp.mu.Unlock()
	if phase != lp.phase {
		lp.phase, lp.done = phase, 0
	}
	lp.done++
	lp.opts.OnProgress(phase, lp.done, total)
}

// owner is the namespace whose result reports a link: its A end's, or its
// B end's when A is not in the fleet (an Up of part of a fleet).
func (lp *linkPhases) owner(l *spec.Link) string {
	if lp.f.Has(l.A.Namespace) {
		return l.A.Namespace
	}
	return l.B.Namespace
}

// mustCheck reports whether the namespace of end must be checked for
// nsfleet's mark before a link is made in it: it was pinned before this
// run (or is not in the fleet), and adopting was not asked for.
func (lp *linkPhases) mustCheck(end spec.LinkEnd) bool {
	i, ok := lp.index[end.Namespace]
	return !lp.opts.Adopt && (!ok || lp.existing[i])
}

// tunnelled reports whether l's other end is served by another node.
func (lp *linkPhases) tunnelled(l *spec.Link) bool {
	if lp.opts.Tunnel == nil {
		return false
	}
	_, _, ok := lp.opts.Tunnel.split(l)
	return ok
}

// blocked says why a link cannot be made now ("" if it can): one of its
// namespaces failed, is not nsfleet's, or is only planned (dry run).
func (lp *linkPhases) blocked(l *spec.Link) (string, Action) {
	for _, end := range []spec.LinkEnd{l.A, l.B} {
		i, ok := lp.index[end.Namespace]
		if !ok || lp.existing[i] {
			continue
		}
		switch lp.held[i].Action {
		case Failed, Skipped:
			return fmt.Sprintf("namespace %s: %s", end.Namespace, lp.held[i].Action), Failed
		case WouldCreate:
			return "", WouldCreate
		}
	}
	return "", ""
}

func (lp *linkPhases) run(ctx context.Context, rd *netns.RunDir, nw int, newWorker func() (*worker, error)) error {
	f := lp.f
	lp.index = make(map[string]int, len(f.Namespaces))
	for i := range f.Namespaces {
		lp.index[f.Namespaces[i].Name] = i
	}
	type linkResult struct {
		did []string
		err error
	}
	res := make([]linkResult, len(f.Links))
	err := pool.Run(ctx, len(f.Links), nw, func() (*linkWorker, error) {
		return newLinkWorker(rd, lp.opts.DryRun)
	}, (*linkWorker).close, func(w *linkWorker, i int) {
		l := &f.Links[i]
		why, action := lp.blocked(l)
		switch {
		case action == WouldCreate:
			res[i].did = []string{"link " + l.String()}
		case why != "":
			res[i].err = fmt.Errorf("link %s: %s", l, why)
		case lp.tunnelled(l):
			res[i].did, res[i].err = w.tunnelUp(l, lp.opts.Tunnel, lp.mustCheck)
		default:
			res[i].did, res[i].err = w.up(l, lp.mustCheck)
		}
		lp.progress("links", len(f.Links))
	})
	if err != nil {
		return err
	}
	byOwner := map[int][]int{}
	for i := range f.Links {
		o := lp.index[lp.owner(&f.Links[i])]
		byOwner[o] = append(byOwner[o], i)
	}
	var todo []int
	for i := range f.Namespaces {
		if len(f.Namespaces[i].Links) > 0 {
			todo = append(todo, i)
		}
	}
	return pool.Run(ctx, len(todo), nw, newWorker, (*worker).close, func(w *worker, k int) {
		i := todo[k]
		ns := &f.Namespaces[i]
		r := lp.held[i]
		switch {
		case lp.existing[i]:
			r = w.repair(ns)
		case r.Action == Created:
			did, err := w.finish(ns)
			r.Fixes = append(r.Fixes, did...)
			if err != nil {
				r.Action, r.Err = Failed, &Error{Op: "up", Namespace: ns.Name, Err: err}
			}
		}
		var errs []error
		owned := byOwner[i]
		if r.Action == Skipped {
			owned = nil // not nsfleet's: the skip says why its links are not made
		}
		for _, li := range owned {
			r.Fixes = append(r.Fixes, res[li].did...)
			if res[li].err != nil {
				errs = append(errs, res[li].err)
			} else if len(res[li].did) > 0 && r.Action == Unchanged {
				r.Action = Repaired
				if lp.opts.DryRun {
					r.Action = WouldRepair
				}
			}
		}
		if len(errs) > 0 {
			var e *Error
			if errors.As(r.Err, &e) {
				errs = append([]error{e.Err}, errs...) // the namespace's own, first
			}
			r.Action, r.Err = Failed, &Error{Op: "up", Namespace: ns.Name, Err: errors.Join(errs...)}
		}
		lp.held[i] = Result{} // tallied
		lp.t.add(r)
	})
}

// tallyRest tallies the held results that the phases did not reach (an
// interrupted run): the next Up finishes them.
func (lp *linkPhases) tallyRest() {
	for i, r := range lp.held {
		if r.Name != "" {
			lp.t.add(r)
			lp.held[i] = Result{}
		}
	}
}

// finish does what create left for after the links: it enslaves the
// bridge ports that are link ends, adds the routes and starts the
// processes.
func (w *worker) finish(ns *spec.Namespace) ([]string, error) {
	h, err := w.rd.Open(ns.Name)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	open := rtnl.OpenLite
	if len(ns.Routes) > 0 {
		open = rtnl.Open
	}
	err = rtnl.Inside(h, open, func(in *rtnl.Conn) error {
		for _, b := range ns.Bridges {
			idx, err := bridgeIndex(in, b)
			if err == nil {
				err = enslavePorts(in, b, idx)
			}
			if err != nil {
				return err
			}
		}
		for _, r := range ns.Routes {
			if err := addRoute(in, r); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return w.startProcesses(h, ns, nil)
}
