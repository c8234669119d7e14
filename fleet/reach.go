package fleet

import (
	"context"
	"fmt"
	"net/netip"
	"sync"

	"github.com/nsfleet/nsfleet/internal/pool"
	"github.com/nsfleet/nsfleet/rtnl"
	"github.com/nsfleet/nsfleet/spec"
)

// Reach is how far a routed network has converged: for each namespace of
// a fleet whose namespaces have loopback addresses, how many of the other
// namespaces' loopback addresses it has a route to.
type Reach struct {
	Want    int            // the other loopback addresses each should reach
	Learned map[string]int // by namespace
	Errors  map[string]error
}

// Converged returns how many namespaces reach every other loopback.
func (r *Reach) Converged() int {
	n := 0
	for _, k := range r.Learned {
		if k >= r.Want {
			n++
		}
	}
	return n
}

// Missing names the namespace (the first by name) that reaches the
// fewest other loopbacks, and how many it reaches ("" when all reach every
// one).
func (r *Reach) Missing() string {
	worst := ""
	for name, k := range r.Learned {
		if k < r.Want && (worst == "" || k < r.Learned[worst] || k == r.Learned[worst] && name < worst) {
			worst = name
		}
	}
	if worst == "" {
		return ""
	}
	return fmt.Sprintf("%s reaches %d of %d", worst, r.Learned[worst], r.Want)
}

// Learned reads the main routing table of every namespace of f and counts,
// for each, the other namespaces' loopback addresses (the first of each
// namespace's LoopbackAddrs) that a route other than a default route
// covers: what a routing daemon (OSPF, BGP) has taught it. A namespace
// without a loopback address is neither asked nor counted.
func Learned(ctx context.Context, f *spec.Fleet, opts Options) (*Reach, error) {
	var owners []int // indexes of the namespaces with a loopback address
	for i := range f.Namespaces {
		if len(f.Namespaces[i].LoopbackAddrs) > 0 {
			owners = append(owners, i)
		}
	}
	r := &Reach{Want: max(len(owners)-1, 0), Learned: map[string]int{}, Errors: map[string]error{}}
	var mu sync.Mutex
	err := pool.Run(ctx, len(owners), opts.workers(len(owners)), nil, nil, func(_ struct{}, k int) {
		ns := &f.Namespaces[owners[k]]
		n, err := learned(opts, f, ns, owners)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			r.Errors[ns.Name] = err
			return
		}
		r.Learned[ns.Name] = n
	})
	return r, err
}

// learned counts the other owners' loopbacks that ns has a route to.
func learned(opts Options, f *spec.Fleet, ns *spec.Namespace, owners []int) (int, error) {
	h, err := opts.RunDir.Open(ns.Name)
	if err != nil {
		return 0, err
	}
	defer h.Close()
	var routes []rtnl.Route
	err = rtnl.Inside(h, rtnl.Open, func(in *rtnl.Conn) error {
		routes, err = in.Routes()
		return err
	})
	if err != nil {
		return 0, err
	}
	have := make(map[netip.Prefix]bool, len(routes))
	for _, rt := range routes {
		if rt.To.Bits() > 0 {
			have[rt.To.Masked()] = true
		}
	}
	n := 0
	for _, i := range owners {
		o := &f.Namespaces[i]
		if o.Name == ns.Name {
			continue
		}
		a := o.LoopbackAddrs[0].Addr()
		// Every prefix that could cover a: at most 32 (128) lookups.
		for bits := a.BitLen(); bits > 0; bits-- {
			if have[netip.PrefixFrom(a, bits).Masked()] {
				n++
				break
			}
		}
	}
	return n, nil
}
