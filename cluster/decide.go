package cluster

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nsfleet/nsfleet/spec"
)

// The agent's decisions are one pure function, Decide, of what it observed:
// what the cluster asks of the node (spec, assignment, lease) and what the
// node holds (pins, and what each namespace was last made to match). The
// agent's loop only gathers an Observation, calls Decide, carries out the
// Decision with the engine of `nsfleet up`, and reports Progress.

// Trigger is why the agent reconciles.
type Trigger int

const (
	// OnChange: the spec or the assignment changed. New namespaces, those
	// whose spec changed and those not ready yet are brought to the spec;
	// the others are not touched.
	OnChange Trigger = iota
	// OnDrift: kernel events named namespaces (Observation.Drifted), or
	// all of them; those are checked against the kernel, with the
	// OnChange ones.
	OnDrift
	// OnResync: every assigned namespace is checked against the kernel
	// (the periodic full check, joining, the lease renewed after a fence).
	OnResync
	// OnWithdraw: the node is not (or no longer) a member: only what is
	// not assigned here is torn down; nothing is created or changed.
	OnWithdraw
)

func (t Trigger) String() string {
	return [...]string{"change", "drift", "resync", "withdraw"}[t]
}

// Catalog is the stored fleet as Decide sees it.
type Catalog interface {
	// Lookup returns what a namespace is to be; false when it is not
	// stored, or its value never decoded.
	Lookup(name string) (*spec.Namespace, bool)
	// Has reports whether a namespace is stored, decoded or not: such a
	// pin is the cluster's.
	Has(name string) bool
}

// Observation is everything Decide depends on.
type Observation struct {
	// What the cluster asks. Fleet holds the stored namespaces (nil:
	// none); when a stored namespace or the node's assignment does not
	// decode, the previous value is kept and the error is set.
	Fleet          Catalog
	SpecErr        error
	Assigned       []string
	AssignErr      error
	AllowProcesses bool
	// Fenced: the lease may have expired (fenced), or is not renewed
	// while no node reaches etcd (failsafe): create and change nothing.
	Fenced bool

	// What the node holds.
	Pins    []string        // nsfleet's run dir as listed (names)
	PinsErr error           // the run dir could not be listed
	Foreign map[string]bool // pinned but not nsfleet's: never touched
	// Served: assigned here at some time in this agent's life. With the
	// spec, it says which pins are the cluster's to tear down.
	Served map[string]bool
	// Applied is what each namespace here was last made to match, with
	// the kernel confirming it (the engine reported it created, repaired
	// or unchanged). A namespace without an entry is not ready.
	Applied    map[string]*spec.Namespace
	Drifted    map[string]bool // OnDrift: the namespaces events named
	AllDrifted bool            // OnDrift: events were lost; check them all
	// Tunnels names the other nodes' tunnel addresses (sorted, joined):
	// where every tunnel end here sends what it has not learned.
	Tunnels string
	// Placed says, for each namespace with links, where its link peers
	// were when it was last made to match (LinkPlaces).
	Placed map[string]string
}

// Decision is what to do.
type Decision struct {
	// Want is what this node must serve: assigned and stored (sorted),
	// but for namespaces that run processes on a node that does not allow
	// them (Refused says how many).
	Want []string
	// Teardown: pinned here, the cluster's (in the spec or served
	// before), not wanted. Foreign pins are never listed.
	Teardown []string
	// Up: wanted namespaces to hand to the engine (create, change, check),
	// in the order the engine takes them: those whose spec changed or that
	// kernel events named first, so that a change of one router is in its
	// kernel before a large creation or check is through.
	Up []string
	// Previous holds, for the Up namespaces whose spec changed, what they
	// were made to match before: what the engine removes that the new
	// spec no longer asks for.
	Previous map[string]*spec.Namespace
	// Places: LinkPlaces of the Up namespaces that have links, for the
	// agent to record once the engine confirmed them.
	Places map[string]string
	// Supervise: the wanted namespaces whose processes the agent keeps
	// running; empty: no supervisor.
	Supervise []string
	// Refused says what of the assignment is not served here ("": all).
	Refused string
	// Idle: the agent is fenced and was not asked to withdraw: it must
	// neither create nor tear down (its lease may still be alive).
	Idle bool
}

// Decide says what the agent does for trigger t, given o.
func Decide(t Trigger, o Observation) Decision {
	var d Decision
	if o.Fenced && t != OnWithdraw {
		d.Idle = true
		return d
	}
	refused := 0
	if o.Fleet != nil {
		for _, n := range o.Assigned {
			ns, ok := o.Fleet.Lookup(n)
			switch {
			case !ok:
			case len(ns.Processes) > 0 && !o.AllowProcesses:
				refused++
			default:
				d.Want = append(d.Want, n)
			}
		}
		slices.Sort(d.Want)
		d.Want = slices.Compact(d.Want)
	}
	if refused > 0 {
		d.Refused = fmt.Sprintf("%d namespaces assigned here run processes; this agent was started without --allow-processes", refused)
	}
	if o.PinsErr == nil {
		for _, p := range o.Pins {
			if o.Foreign[p] || isIn(d.Want, p) {
				continue
			}
			if o.Fleet != nil && o.Fleet.Has(p) || o.Served[p] {
				d.Teardown = append(d.Teardown, p)
			}
		}
		slices.Sort(d.Teardown)
	}
	if t == OnWithdraw {
		d.Want = nil
		return d
	}
	var rest []string // Up's after the urgent ones
	for _, n := range d.Want {
		want, _ := o.Fleet.Lookup(n)
		prev, applied := o.Applied[n]
		changed := applied && !prev.Same(want)
		if changed {
			if d.Previous == nil {
				d.Previous = map[string]*spec.Namespace{}
			}
			d.Previous[n] = prev
		}
		// A link changes form when its other end comes here (a veth) or
		// leaves (a tunnel), and a tunnel end's flood list with the nodes.
		places, moved := "", false
		if len(want.Links) > 0 {
			places = LinkPlaces(want, d.Want, o.Tunnels)
			moved = places != o.Placed[n]
		}
		if len(want.Processes) > 0 {
			d.Supervise = append(d.Supervise, n)
		}
		named := t == OnDrift && o.Drifted[n]
		checked := moved || !applied || t == OnResync || t == OnDrift && o.AllDrifted
		switch {
		case changed || named:
			d.Up = append(d.Up, n)
		case checked:
			rest = append(rest, n)
		default:
			continue
		}
		if places != "" {
			if d.Places == nil {
				d.Places = map[string]string{}
			}
			d.Places[n] = places
		}
	}
	d.Up = append(d.Up, rest...)
	return d
}

// LinkPlaces says where the other ends of ns's links are: for each link,
// the other namespace and whether it is served here (among want, sorted);
// and, when one is not, the nodes the tunnels flood to (tunnels). Two
// different values mean some link of ns must change form.
func LinkPlaces(ns *spec.Namespace, want []string, tunnels string) string {
	var b strings.Builder
	remote := false
	for i := range ns.Links {
		_, other := ns.Links[i].Ends(ns.Name)
		here := isIn(want, other.Namespace)
		remote = remote || !here
		b.WriteString(other.Namespace)
		if here {
			b.WriteString(" here\n")
		} else {
			b.WriteString(" elsewhere\n")
		}
	}
	if remote {
		b.WriteString("tunnels to " + tunnels)
	}
	return b.String()
}

func isIn(sorted []string, s string) bool {
	_, ok := slices.BinarySearch(sorted, s)
	return ok
}

// Progress is how far the node is with what it was asked, by the kernel's
// word: a namespace counts as ready only when the engine last confirmed it
// matches the spec as it is stored now.
type Progress struct {
	Want, Ready int
	// Converged: every wanted namespace is ready at the current spec,
	// nothing that must go is left, the spec and assignment decoded and
	// are served. Only then may the node report the revisions it holds.
	Converged bool
}

// Measure computes the Progress of a node after a Decision was carried out
// (teardownOK: every namespace of d.Teardown is gone).
func Measure(o Observation, d Decision, teardownOK bool) Progress {
	p := Progress{Want: len(d.Want)}
	for _, n := range d.Want {
		want, _ := o.Fleet.Lookup(n)
		have, ok := o.Applied[n]
		// A linked namespace is ready only with its links in the form
		// where its peers are now (veth or tunnel).
		if ok && have.Same(want) && (len(want.Links) == 0 || o.Placed[n] == LinkPlaces(want, d.Want, o.Tunnels)) {
			p.Ready++
		}
	}
	p.Converged = teardownOK && o.PinsErr == nil && p.Ready == p.Want && d.Refused == "" &&
		o.SpecErr == nil && o.AssignErr == nil && !o.Fenced
	return p
}
