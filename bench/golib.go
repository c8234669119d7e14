package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/vishvananda/netlink"
	vnetns "github.com/vishvananda/netns"
)

// The netlink engine: routers and veth pairs made the way most Go tools in
// this space make them (CNI plugins, containerlab, Docker's libnetwork),
// with vishvananda/netns and vishvananda/netlink as their documentation
// shows: netns.NewNamed for a pinned namespace (unshare, then a bind mount
// in /run/netns), a netlink.Handle per namespace (NewHandleAt), LinkByName
// and LinkSetUp for lo, sysctls written to /proc/sys from a thread inside
// the namespace, and LinkAdd of a Veth whose peer is placed by
// PeerNamespace. It runs with as many workers as the native engine, each
// on a locked OS thread (setns changes only the calling thread), so that
// what differs from native is how each router is made, not parallelism.
// netlink-1q is the same with one queue per veth end (NumTxQueues and
// NumRxQueues 1), as nsfleet makes them, to measure that one choice.

// netlinkRouters makes routers from..to of a fake-router variant.
func netlinkRouters(ctx context.Context, prefix string, st routerSteps, from, to, workers int, oneQueue bool) error {
	if workers <= 0 {
		workers = runtime.NumCPU()
	}
	next := make(chan int)
	errs := make(chan error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			// The thread is not unlocked: if a setns back failed it is in
			// the wrong namespace, and Go then ends it with the goroutine.
			origin, err := vnetns.Get()
			if err != nil {
				errs <- err
				return
			}
			defer origin.Close()
			host, err := netlink.NewHandle()
			if err != nil {
				errs <- err
				return
			}
			defer host.Close()
			for i := range next {
				if err := netlinkRouter(host, origin, prefix, st, i, oneQueue); err != nil {
					errs <- err
					for range next {
					}
					return
				}
			}
			runtime.UnlockOSThread()
		}()
	}
	var err error
feed:
	for i := from; i <= to; i++ {
		select {
		case next <- i:
		case err = <-errs:
			break feed
		case <-ctx.Done():
			err = ctx.Err()
			break feed
		}
	}
	close(next)
	wg.Wait()
	close(errs)
	for e := range errs {
		err = errors.Join(err, e)
	}
	return err
}

// netlinkRouter makes router i on the calling (locked) thread, which it
// leaves in origin. Without oneQueue the veth gets the kernel's default
// queue count, as LinkAdd leaves it.
func netlinkRouter(host *netlink.Handle, origin vnetns.NsHandle, prefix string, st routerSteps, i int, oneQueue bool) error {
	name := prefix + "r" + strconv.Itoa(i)
	ns, err := vnetns.NewNamed(name) // the thread is now inside
	if err != nil {
		vnetns.Set(origin)
		return fmt.Errorf("netns.NewNamed %s: %w", name, err)
	}
	defer ns.Close()
	if st.forward {
		if err := os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644); err != nil {
			vnetns.Set(origin)
			return fmt.Errorf("%s: ip_forward: %w", name, err)
		}
	}
	if err := vnetns.Set(origin); err != nil {
		return fmt.Errorf("back from %s: %w", name, err)
	}
	if st.loUp {
		h, err := netlink.NewHandleAt(ns)
		if err != nil {
			return fmt.Errorf("%s: handle: %w", name, err)
		}
		lo, err := h.LinkByName("lo")
		if err == nil {
			err = h.LinkSetUp(lo)
		}
		h.Close()
		if err != nil {
			return fmt.Errorf("%s: lo up: %w", name, err)
		}
	}
	for k := 0; k < st.links; k++ {
		veth := &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: fmt.Sprintf("%s%c%d", prefix, "og"[k], i)},
			PeerName:      fmt.Sprintf("q%c%d", "rg"[k], i),
			PeerNamespace: netlink.NsFd(int(ns)),
		}
		if oneQueue {
			veth.NumTxQueues, veth.NumRxQueues = 1, 1
		}
		if err := host.LinkAdd(veth); err != nil {
			return fmt.Errorf("%s: veth %s: %w", name, veth.Name, err)
		}
	}
	return nil
}

// netlinkPair makes veth pair i (or dummy device i) of a veth variant with
// the library, on a handle in namespace A; the peer goes to b.
func netlinkPair(h *netlink.Handle, b *netns.NS, variant string, i int) error {
	if variant == "dummy" {
		return h.LinkAdd(&netlink.Dummy{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("d%d", i)}})
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: fmt.Sprintf("h%d", i)}, PeerName: fmt.Sprintf("p%d", i)}
	if variant != "default-queues" {
		veth.NumTxQueues, veth.NumRxQueues = 1, 1
	}
	if variant != "peer-moved" {
		veth.PeerNamespace = netlink.NsFd(b.Fd())
	}
	if err := h.LinkAdd(veth); err != nil {
		return err
	}
	if variant == "peer-moved" {
		peer, err := h.LinkByName(veth.PeerName)
		if err != nil {
			return err
		}
		return h.LinkSetNsFd(peer, b.Fd())
	}
	return nil
}
