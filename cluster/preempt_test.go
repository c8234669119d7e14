package cluster

import (
	"context"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

func putOf(key string) clientv3.WatchResponse {
	return clientv3.WatchResponse{Events: []*clientv3.Event{{Type: mvccpb.PUT, Kv: &mvccpb.KeyValue{Key: []byte(key)}}}}
}

// The pump hands every response on, and makes a bring-up that has run for
// preemptAfter give way to a change of a namespace assigned here, and to
// nothing else.
func TestPumpGivesWay(t *testing.T) {
	a := &Agent{}
	assigned := []string{"r-1", "r-2"}
	a.assigned.Store(&assigned)
	for _, tc := range []struct {
		name  string
		resp  clientv3.WatchResponse
		ran   time.Duration
		fired bool
	}{
		{"a namespace assigned here changed", putOf(NsKey("gw", "r-2")), preemptAfter, true},
		{"the same, but the bring-up has only just begun", putOf(NsKey("gw", "r-2")), 0, false},
		{"a namespace served elsewhere", putOf(NsKey("gw", "r-9")), preemptAfter, false},
		{"another node's status", putOf(StatusKey("node-2")), preemptAfter, false},
		{"this node's assignment (a bulk of its own)", putOf(AssignNodePrefix("node-1") + "07"), preemptAfter, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPreemption(context.Background())
			p.start = time.Now().Add(-tc.ran)
			a.preempt.Store(p)
			src := make(chan clientv3.WatchResponse, 1)
			dst := make(chan watchItem, 1)
			go a.pump(context.Background(), src, dst)
			src <- tc.resp
			close(src)
			if it := <-dst; !it.ok || len(it.resp.Events) != 1 {
				t.Fatalf("handed on %+v", it)
			}
			if it, ok := <-dst; ok {
				t.Fatalf("after the watch ended: %+v, want the channel closed", it)
			}
			if got := p.fired.Load(); got != tc.fired || (p.ctx.Err() != nil) != tc.fired {
				t.Errorf("gave way %v (ctx %v), want %v", got, p.ctx.Err(), tc.fired)
			}
		})
	}
}
