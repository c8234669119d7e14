package results

import (
	"path/filepath"
	"testing"

	"github.com/nsfleet/nsfleet/bench"
	"github.com/nsfleet/nsfleet/bench/benchtest"
)

func TestStoreRoundTrip(t *testing.T) {
	st, err := Open(filepath.Join(t.TempDir(), "b.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	r := benchtest.Synthetic("20261129-000000-abcd", []float64{1000, 1010}, []float64{20, 21})
	r.Env = bench.Env{Kernel: "6.18 #1", CPUs: 2}
	if err := st.Save(r); err != nil {
		t.Fatal(err)
	}
	list, err := st.List()
	if err != nil || len(list) != 1 || list[0].Samples != len(r.Samples) || list[0].Kernel != "6.18" {
		t.Fatalf("list %+v %v", list, err)
	}
	got, err := st.Load("20261129-000000")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Samples) != len(r.Samples) || got.Samples[3].Value != r.Samples[3].Value || got.Samples[3].Config["engine"] != r.Samples[3].Config["engine"] || got.Env.CPUs != 2 {
		t.Fatalf("loaded %+v", got)
	}
	if _, err := st.Load("nope"); err == nil {
		t.Fatal("loaded a run that does not exist")
	}
}
