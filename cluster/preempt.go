package cluster

import (
	"context"
	"strings"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// A large bring-up (a check of every namespace after a bulk creation, a
// resync, thousands made after a failover) takes seconds on a node of
// 13,000 routers. A change of one router served here must not wait for it:
// the watch's pump sees the change arrive and the bring-up gives way. It
// stops starting namespaces, finishes those in flight, and hands what it
// did not reach back as drift, which is checked right after the change
// (Decide puts changed namespaces first).

// preemptMin is the smallest bring-up that may give way: a smaller one is
// over in about the time giving way would take.
const preemptMin = 64

// preemptAfter is how long a bring-up runs before it may give way, so that
// a stream of changes (a large apply arriving key by key) cannot starve it.
const preemptAfter = 250 * time.Millisecond

// preemption is one bring-up that may give way.
type preemption struct {
	ctx    context.Context
	cancel context.CancelFunc
	start  time.Time
	fired  atomic.Bool
}

func newPreemption(ctx context.Context) *preemption {
	p := &preemption{start: time.Now()}
	p.ctx, p.cancel = context.WithCancel(ctx)
	return p
}

// giveWay stops the bring-up if it has run for preemptAfter.
func (p *preemption) giveWay() {
	if time.Since(p.start) >= preemptAfter && !p.fired.Swap(true) {
		p.cancel()
	}
}

// watchItem is one watch response as the pump hands it on; ok false: the
// watch ended.
type watchItem struct {
	resp clientv3.WatchResponse
	ok   bool
}

// pump hands the watch's responses to the serve loop and, for one that
// changes a namespace assigned here, makes a bring-up in flight give way.
// It ends with the watch (telling the loop) or with ctx.
func (a *Agent) pump(ctx context.Context, src clientv3.WatchChan, dst chan<- watchItem) {
	defer close(dst)
	for resp := range src {
		if p := a.preempt.Load(); p != nil && a.changesAssigned(resp) {
			p.giveWay()
		}
		select {
		case dst <- watchItem{resp, true}:
		case <-ctx.Done():
			return
		}
	}
}

// changesAssigned reports whether resp changes the stored value of a
// namespace assigned here (as the serve loop last merged the assignment).
func (a *Agent) changesAssigned(resp clientv3.WatchResponse) bool {
	assigned := a.assigned.Load()
	if assigned == nil {
		return false
	}
	for _, ev := range resp.Events {
		k := string(ev.Kv.Key)
		if !strings.HasPrefix(k, NsPrefix) {
			continue
		}
		if _, name, ok := splitKey(k, NsPrefix); ok && isIn(*assigned, name) {
			return true
		}
	}
	return false
}
