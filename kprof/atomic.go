package kprof

import "sync/atomic"

// The ring buffer's head is written by the kernel and the tail by us; the
// kernel documents load-acquire and store-release for them.
func atomicLoad(p *uint64) uint64     { return atomic.LoadUint64(p) }
func atomicStore(p *uint64, v uint64) { atomic.StoreUint64(p, v) }
