// Package pool runs indexed work on a bounded number of workers, and keeps
// nsfleet inside its file-descriptor limit.
//
// Every nsfleet command does per-namespace work that holds descriptors for a
// moment (a pin, a netlink socket, a procfs instance, a pipe). Run bounds
// the workers, Fit sizes them from what RLIMIT_NOFILE leaves free, and Retry
// waits out EMFILE and ENFILE instead of failing: under `ulimit -n 32` a
// command is slower, never wrong.
//
// # Threading contract
//
// Run calls fn from up to Workers goroutines at once, each with its own
// worker state; fn must be safe for that. Nothing here touches namespaces.
package pool

import (
	"context"
	"sync"
	"sync/atomic"
)

// Run calls fn(w, i) for every i in [0, n) on at most workers goroutines,
// until all are done or ctx is cancelled (then no new i is started; those
// in flight finish). Each goroutine first gets its own state from open (nil:
// the zero W) and hands it to done (nil: nothing) when it ends. A goroutine
// whose open fails does no work; Run returns the first such error only if
// no goroutine could open at all.
func Run[W any](ctx context.Context, n, workers int, open func() (W, error), done func(W), fn func(w W, i int)) error {
	workers = max(min(workers, n), 1)
	if n <= 0 {
		return nil
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	var opened atomic.Int64
	errs := make([]error, workers)
	for k := 0; k < workers; k++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var w W
			if open != nil {
				var err error
				if w, err = open(); err != nil {
					errs[k] = err
					return
				}
			}
			opened.Add(1)
			if done != nil {
				defer done(w)
			}
			for ctx.Err() == nil {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				fn(w, i)
			}
		}()
	}
	wg.Wait()
	if opened.Load() == 0 {
		for _, err := range errs {
			if err != nil {
				return err
			}
		}
	}
	return nil
}

// Each is Run without worker state.
func Each(ctx context.Context, n, workers int, fn func(i int)) {
	Run[struct{}](ctx, n, workers, nil, nil, func(_ struct{}, i int) { fn(i) })
}
