// Package bench is nsfleet's scalability lab: it reproduces the workloads of
// the reports (docs/BACKGROUND.md) as scenarios, runs competing methods
// ("engines") and variants side by side in one run, repeats runs, and keeps
// every figure with its spread and the environment it was measured in.
//
// A Run is one invocation: a scenario, its parameters, the environment, and
// Samples. A Sample is one number: the value of a metric (throughput per
// mark, a step's time, a count) for one configuration (engine, variant, ...)
// in one repetition. Everything else (tables, benchfmt, plots, comparisons,
// the store) is built from Samples.
//
// Scenarios make namespaces only under their own prefix and in a run dir of
// their own, and clean up whatever happens (see Scenario).
package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"syscall"
	"time"
)

// Sample is one measured value.
type Sample struct {
	Config map[string]string `json:"config"` // engine, variant, ...
	Mark   int               `json:"mark"`   // the x value (e.g. routers made so far); 0 if none
	Metric string            `json:"metric"` // e.g. "rate", "step/veth"
	Unit   string            `json:"unit"`   // e.g. "routers/s", "us"
	Better string            `json:"better"` // "higher" or "lower"
	Rep    int               `json:"rep"`    // repetition, from 0
	Value  float64           `json:"value"`
}

// Matches reports whether the sample's configuration has every key=value
// of cfg.
func (x Sample) Matches(cfg map[string]string) bool {
	for k, v := range cfg {
		if x.Config[k] != v {
			return false
		}
	}
	return true
}

// ConfigKey renders a configuration as "engine=native/variant=add", keys in
// the scenario's order.
func ConfigKey(c map[string]string, order []string) string {
	keys := append([]string(nil), order...)
	var rest []string
	for k := range c {
		found := false
		for _, o := range order {
			found = found || o == k
		}
		if !found {
			rest = append(rest, k)
		}
	}
	sort.Strings(rest)
	keys = append(keys, rest...)
	var parts []string
	for _, k := range keys {
		if v, ok := c[k]; ok {
			parts = append(parts, k+"="+v)
		}
	}
	return strings.Join(parts, "/")
}

// Run is one invocation of a scenario.
type Run struct {
	ID       string            `json:"id"`
	Scenario string            `json:"scenario"`
	Started  time.Time         `json:"started"`
	Elapsed  float64           `json:"elapsed_s"`
	Params   map[string]string `json:"params"`
	Env      Env               `json:"env"`
	Samples  []Sample          `json:"samples"`
	Skipped  []string          `json:"skipped,omitempty"` // "engine=pyroute2: not installed"
	Notes    []string          `json:"notes,omitempty"`
	Keys     []string          `json:"config_keys"` // configuration keys in display order
}

// NewID returns a short random run id.
func NewID() string {
	b := make([]byte, 4)
	rand.Read(b)
	return time.Now().UTC().Format("20060102-150405") + "-" + hex.EncodeToString(b)
}

// Options are what a scenario is asked to do.
type Options struct {
	N        int      // namespaces, pairs, iterations...; 0: the scenario's default
	Mark     int      // interval of the marks; 0: the scenario's default
	Runs     int      // repetitions; 0: 1
	Engines  []string // nil: all the scenario knows
	Variants []string // nil: all
	Prefix   string   // name prefix for everything made
	RunDir   string   // a run dir of the scenario's own
	Workers  int      // native engine workers; 0: fleet's default
	Log      *slog.Logger
	// Progress, if set, is told of each mark reached.
	Progress func(config string, rep, done, total int)
}

// Scenario is one experiment of the reports: what it is called,
// what it can vary, and the function that runs it.
type Scenario struct {
	Name     string
	Describe string   // one line: what it measures and which report it reproduces
	N, Mark  int      // the defaults of Options.N and Options.Mark
	Engines  []string // the methods it can compare
	Variants []string // the cases it can run
	Keys     []string // configuration keys, in display order
	// Run measures and appends to run (samples, skipped engines, notes).
	// Execute has resolved Options (Engines and Variants among those
	// above, in the order asked). It must remove everything it made before
	// returning, also on error or cancellation.
	Run func(ctx context.Context, o Options, run *Run) error
}

var registry = map[string]*Scenario{}

func register(s *Scenario) { registry[s.Name] = s }

// Lookup returns a scenario by name.
func Lookup(name string) (*Scenario, error) {
	s, ok := registry[name]
	if !ok {
		return nil, fmt.Errorf("unknown scenario %q (have %s)", name, strings.Join(Names(), ", "))
	}
	return s, nil
}

// Names lists the scenarios.
func Names() []string {
	var out []string
	for n := range registry {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// ownUserNamespace starts a helper in a user namespace of its own, with
// nsfleet's user mapped to root there: it may lower namespace limits
// without touching the host's.
func ownUserNamespace() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{
		Cloneflags:  syscall.CLONE_NEWUSER,
		UidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Geteuid(), Size: 1}},
		GidMappings: []syscall.SysProcIDMap{{ContainerID: 0, HostID: os.Getegid(), Size: 1}},
	}
}

func pick(all, want []string) ([]string, error) {
	if len(want) == 0 {
		return all, nil
	}
	for _, w := range want {
		ok := false
		for _, a := range all {
			ok = ok || a == w
		}
		if !ok {
			return nil, fmt.Errorf("%q is not one of %s", w, strings.Join(all, ", "))
		}
	}
	return want, nil
}

// ReadJSON reads a run written by WriteJSON.
func ReadJSON(path string) (*Run, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r, err := ParseRun(b)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// ParseRun parses a run in the JSON form WriteJSON writes.
func ParseRun(b []byte) (*Run, error) {
	var r Run
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, err
	}
	if r.Scenario == "" || r.Samples == nil {
		return nil, errors.New("not an nsfleet bench run (no scenario or samples)")
	}
	for i, x := range r.Samples {
		if x.Metric == "" {
			return nil, fmt.Errorf("sample %d has no metric", i)
		}
	}
	return &r, nil
}
