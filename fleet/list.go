package fleet

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/nsfleet/nsfleet/internal/pool"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/process"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
	"github.com/nsfleet/nsfleet/sysctl"
)

// State is a namespace's state as List sees it.
type State string

const (
	StateOK      State = "ok"      // pinned, nsfleet's, and (with a spec) matching it
	StateDrift   State = "drift"   // pinned and nsfleet's, but not as the spec says
	StateForeign State = "foreign" // pinned, not made by nsfleet
	StateStale   State = "stale"   // a pin file with no namespace mounted on it
	StateMissing State = "missing" // in the spec, not on the machine
	StateError   State = "error"
	// StateUnread: pinned, but not looked into (Options.PinsOnly: the
	// caller may not enter namespaces).
	StateUnread State = "unread"
)

// LinkStatus is one device inside a namespace.
type LinkStatus struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Up   bool   `json:"up"`
	MTU  int    `json:"mtu"`
	Host string `json:"host_end,omitempty"` // a veth's end in the host namespace
	// Peer is a link's other end, NAMESPACE:INTERFACE, as the spec names
	// it (ls with a spec).
	Peer string `json:"peer,omitempty"`
}

// ProcStatus is one supervised process as List reports it.
type ProcStatus struct {
	Name     string `json:"name"`
	PID      int    `json:"pid,omitempty"`
	State    string `json:"state"` // running, exited, stopped, not started
	Restarts int    `json:"restarts"`
	Log      string `json:"log,omitempty"`
}

// Status is one namespace as List reports it.
type Status struct {
	Name  string       `json:"name"`
	State State        `json:"state"`
	Inode uint64       `json:"inode,omitempty"`
	Owned bool         `json:"nsfleet"`
	Links []LinkStatus `json:"links,omitempty"`
	Procs []ProcStatus `json:"processes,omitempty"`
	Drift []string     `json:"drift,omitempty"`
	Error string       `json:"error,omitempty"`
}

// List reports the selected namespaces. With a fleet, they are the fleet's
// namespaces (missing ones included) and each is compared with its spec;
// otherwise they are the run dir's pins matching sel.
func List(ctx context.Context, f *spec.Fleet, sel Selector, opts ListOptions) ([]Status, error) {
	opts.Options = opts.Options.withDefaults()
	rd := opts.RunDir
	// The host's links are read while the run dir is: both are one pass
	// over something as long as the fleet, on one CPU each.
	table := make(chan *rtnl.LinkTable, 1)
	if !opts.PinsOnly {
		go func() {
			t, _ := rtnl.ReadLinkTable() // nil: host ends are asked about by name
			table <- t
		}()
	}
	all, err := rd.List()
	if err != nil {
		return nil, fmt.Errorf("ls: %w", err)
	}
	pins := map[string]netns.PinInfo{}
	for _, p := range all {
		pins[p.Name] = p
	}
	var names []string
	if f != nil {
		names = f.Names()
	} else {
		for _, p := range sel.match(all) {
			names = append(names, p.Name)
		}
	}
	if opts.PinsOnly {
		out := make([]Status, len(names))
		for i, name := range names {
			out[i] = Status{Name: name}
			if !pinState(pins, &out[i]) {
				out[i].State = StateUnread
			}
			if opts.OnStatus != nil {
				opts.OnStatus(out[i])
			}
		}
		if opts.OnStatus != nil {
			return nil, nil
		}
		return out, nil
	}
	// No rtnetlink dump of the host's links: see rtnl.Devices and
	// rtnl.LinkTable.
	snap, err := hostSnapshot(f, nil)
	if err != nil {
		return nil, fmt.Errorf("ls: %w", err)
	}
	defer snap.close()
	snap.links = <-table

	out := make([]Status, len(names))
	needProc := false
	if f != nil {
		for i := range f.Namespaces {
			needProc = needProc || len(f.Namespaces[i].Sysctls) > 0
		}
	}
	// One read of the store says which namespaces have processes recorded.
	var recorded map[string]bool
	if opts.Store != nil {
		recorded, _ = opts.Store.Namespaces() // nil on error: ask each
	}
	emit := newEmitter(out, opts.OnStatus)
	pool.Run(ctx, len(names), pool.Fit(opts.workers(len(names)), fdsPerChecker), func() (*reader, error) {
		return openReader(needProc), nil
	}, (*reader).close, func(r *reader, i int) {
		defer emit.done(i)
		name := names[i]
		st := &out[i]
		st.Name = name
		if pinState(pins, st) {
			return
		}
		var want *spec.Namespace
		if f != nil {
			want, _ = f.Lookup(name)
		}
		if err := inspect(rd, r, snap, want, st); err != nil {
			st.State, st.Error = StateError, err.Error()
		}
		procStates(opts.Store, recorded, want, st)
	})
	if ctx.Err() != nil {
		return emit.result(), ctx.Err()
	}
	return emit.result(), nil
}

// emitter hands statuses over in order as they are finished (OnStatus),
// dropping each once handed over; without OnStatus it does nothing.
type emitter struct {
	mu   sync.Mutex
	out  []Status
	fin  []bool
	next int
	fn   func(Status)
}

func newEmitter(out []Status, fn func(Status)) *emitter {
	e := &emitter{out: out, fn: fn}
	if fn != nil {
		e.fin = make([]bool, len(out))
	}
	return e
}

func (e *emitter) done(i int) {
	if e.fn == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.fin[i] = true
	for e.next < len(e.out) && e.fin[e.next] {
		e.fn(e.out[e.next])
		e.out[e.next] = Status{}
		e.next++
	}
}

func (e *emitter) result() []Status {
	if e.fn != nil {
		return nil
	}
	return e.out
}

// pinState fills in st from its pin and reports whether that says it all
// (missing, stale, or not a namespace); otherwise the namespace is there
// to look into, and st has its inode.
func pinState(pins map[string]netns.PinInfo, st *Status) bool {
	p, ok := pins[st.Name]
	if !ok {
		st.State = StateMissing
		return true
	}
	switch p.State() {
	case netns.PinSymlink:
		st.State, st.Error = StateError, "pin is a symbolic link"
	case netns.PinOtherMount:
		st.State, st.Error = StateError, "something other than a namespace is mounted on the pin"
	case netns.PinStale:
		st.State = StateStale
	default:
		st.Inode = p.Inode
		return false
	}
	return true
}

// procStates fills in the namespace's processes: those recorded, and those
// the spec wants but nobody started (drift). recorded, when not nil, holds
// the namespaces that have records (Store.Namespaces); others are not asked.
func procStates(store *process.Store, recorded map[string]bool, want *spec.Namespace, st *Status) {
	if store == nil {
		return
	}
	var recs []*process.Record
	if recorded == nil || recorded[st.Name] {
		recs, _ = store.Records(st.Name)
	}
	seen := map[string]bool{}
	for _, r := range recs {
		ps := ProcStatus{Name: r.Name, PID: r.PID, State: "running", Restarts: r.Restarts, Log: store.LogPath(st.Name, r.Name)}
		switch {
		case r.Stopped:
			ps.State, ps.PID = "stopped", 0
		case !process.Alive(r):
			ps.State, ps.PID = "exited", 0
		}
		seen[r.Name] = true
		st.Procs = append(st.Procs, ps)
	}
	if want == nil {
		return
	}
	for _, p := range want.Processes {
		if !seen[p.Name] {
			st.Procs = append(st.Procs, ProcStatus{Name: p.Name, State: "not started"})
		}
	}
	for _, ps := range st.Procs {
		if ps.State != "running" && st.State == StateOK {
			st.State = StateDrift
		}
		if ps.State != "running" {
			st.Drift = append(st.Drift, "process "+ps.Name+" "+ps.State)
		}
	}
}

// reader is one List worker's: its thread, which enters each namespace
// in turn (nil where it may not: then each entry is a netns.Do), and its
// procfs instance (rotated as package sysctl says, never one per
// namespace; nil unless the spec has sysctls).
type reader struct {
	thread  *netns.Thread
	sysctls *sysctl.Procfs
}

// openReader runs on the worker's goroutine, which keeps the thread.
func openReader(needProc bool) *reader {
	r := &reader{}
	r.thread, _ = netns.LockThread()
	if needProc {
		if p, err := sysctl.Open(); err == nil {
			r.sysctls = p
		}
	}
	return r
}

func (r *reader) close() {
	r.sysctls.Close()
	r.thread.Close()
}

func inspect(rd *netns.RunDir, r *reader, snap *snapshot, want *spec.Namespace, st *Status) error {
	h, err := rd.OpenKnown(st.Name, st.Inode)
	if err != nil {
		return err
	}
	defer h.Close()
	st.Inode = h.Inode()
	obs := Observed{HostAddrs: snap.addrs}
	if want != nil {
		if obs.HostLinks, err = snap.hostLinks(want); err != nil {
			return err
		}
		if obs.HostIPv6On, err = snap.hostIPv6(want); err != nil {
			return err
		}
	}
	pfs := r.sysctls
	if want != nil && len(want.Sysctls) > 0 {
		if pfs == nil {
			return errors.New("no procfs instance to read sysctls with")
		}
		if err := pfs.NextNamespace(); err != nil {
			return err
		}
	}
	var fixes []Fix
	open := rtnl.OpenLite // links and an id: one socket
	if want != nil && needsFullObserve(want) {
		open = rtnl.Open // addresses and routes, for the spec's drift
	}
	err = rtnl.InsideOn(r.thread, h, open, func(in *rtnl.Conn) error {
		var err error
		if want == nil {
			got, err := in.Survey(nil)
			if err == nil {
				obs.Links = got.Links
			}
			return err
		}
		if err := observe(in, pfs, want, nil, &obs); err != nil {
			return err
		}
		fixes, err = Diff(want, &obs, false)
		return err
	})
	st.Owned = obs.Owned()
	peers := map[string]string{} // link ends: the other end, as the spec names it
	if want != nil {
		for i := range want.Links {
			mine, other := want.Links[i].Ends(want.Name)
			peers[mine.Interface] = other.String()
		}
	}
	for _, l := range obs.Links {
		ls := LinkStatus{Name: l.Name, Type: l.Type, Up: l.Up, MTU: l.MTU}
		switch {
		case l.Type != "veth":
		case peers[l.Name] != "":
			ls.Peer = peers[l.Name]
		default:
			ls.Host = snap.hostEnd(&obs, l)
		}
		st.Links = append(st.Links, ls)
	}
	if want != nil && err == nil {
		st.Drift = append(st.Drift, DiffLinkEnds(want, &obs)...)
	}
	var conflict *Conflict
	switch {
	case errors.As(err, &conflict):
		st.Drift = append(st.Drift, conflict.Reason)
		err = nil
	case err != nil:
		return err
	}
	for _, f := range fixes {
		st.Drift = append(st.Drift, f.Reason)
	}
	switch {
	case !st.Owned:
		st.State = StateForeign
	case len(st.Drift) > 0:
		st.State = StateDrift
	default:
		st.State = StateOK
	}
	return nil
}
