// Package benchtest makes runs for the lab's tests.
package benchtest

import (
	"time"

	"github.com/nsfleet/nsfleet/bench"
)

// Synthetic makes a fake-router-like run: two engines, two marks, the
// given values per repetition.
func Synthetic(id string, native, other []float64) *bench.Run {
	r := &bench.Run{ID: id, Scenario: "fake-router", Keys: []string{"engine", "variant"}, Params: map[string]string{"n": "500"}, Started: time.Now()}
	for rep := range native {
		for _, mark := range []int{250, 500} {
			r.Samples = append(r.Samples,
				bench.Sample{Config: map[string]string{"engine": "native", "variant": "add"}, Mark: mark, Metric: "rate", Unit: "routers/s", Better: "higher", Rep: rep, Value: native[rep]},
				bench.Sample{Config: map[string]string{"engine": "iproute2", "variant": "add"}, Mark: mark, Metric: "rate", Unit: "routers/s", Better: "higher", Rep: rep, Value: other[rep]})
		}
	}
	return r
}
