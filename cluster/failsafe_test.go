package cluster

import "testing"

func TestFailsafeVerdict(t *testing.T) {
	cut := &PeerAnswer{Node: "x", ReachesEtcd: false}
	reaches := &PeerAnswer{Node: "x", ReachesEtcd: true}
	for _, tc := range []struct {
		name    string
		peers   []string
		answers map[string]*PeerAnswer
		serve   bool
	}{
		{"no peers: nobody can take over", nil, nil, true},
		{"all answer, none reaches etcd: an etcd outage", []string{"a", "b"}, map[string]*PeerAnswer{"a": cut, "b": cut}, true},
		{"one reaches etcd: it may take over", []string{"a", "b"}, map[string]*PeerAnswer{"a": cut, "b": reaches}, false},
		{"one does not answer: it may be the one that reaches etcd", []string{"a", "b"}, map[string]*PeerAnswer{"a": cut}, false},
		{"cut off from everyone", []string{"a", "b"}, map[string]*PeerAnswer{}, false},
	} {
		if got, why := FailsafeVerdict(tc.peers, tc.answers); got != tc.serve {
			t.Errorf("%s: serve %v (%s), want %v", tc.name, got, why, tc.serve)
		}
	}
}
