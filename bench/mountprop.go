package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"time"

	"github.com/nsfleet/nsfleet/netns"
	"golang.org/x/sys/unix"
)

// mountProp reproduces thread 003 (docs/BACKGROUND.md): with M idle mount namespaces
// that share the run dir's propagation (as services under systemd do),
// every pin is copied into each of them. It adds and deletes N namespaces
// under three run-dir layouts, and times what every `ip netns exec` pays
// (a new mount namespace: unshare -m, copying every mount) against a
// setns-only exec, as the pins pile up.
type mountProp struct{}

func init() {
	register(&Scenario{
		Name:     "mount-propagation",
		Describe: "thread 003: add/delete N namespaces with M idle mount namespaces (--idle), per run-dir layout; new mount namespace vs setns-only exec",
		N:        1000,
		Mark:     250,
		Engines:  []string{"native"},
		Variants: []string{"shared", "parent-shared", "private"},
		Keys:     []string{"layout"},
		Run:      mountProp{}.Run,
	})
}

// IdleMountNamespaces is M, the idle mount namespaces held open.
var IdleMountNamespaces = 100

func (m mountProp) Run(ctx context.Context, o Options, run *Run) error {
	layouts := o.Variants
	if _, err := exec.LookPath("unshare"); err != nil {
		run.Skipped = append(run.Skipped, "all: unshare(1) not installed (Debian: util-linux)")
		return nil
	}
	run.Params["idle"] = strconv.Itoa(IdleMountNamespaces)
	run.Notes = append(run.Notes,
		"shared: the run dir is its own shared mount point (iproute2 today); parent-shared: the run dir is a plain directory in a shared mount (systemd's rshared /); private: its own private mount point (pins do not propagate)",
		"new mount namespace: time of `unshare --mount true`, the copy every ip netns exec makes; setns exec: `nsfleet exec NAME -- true`")
	for _, layout := range layouts {
		for rep := 0; rep < o.Runs; rep++ {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			cfg := map[string]string{"layout": layout}
			o.Log.Info("run", "layout", layout, "rep", rep+1)
			if err := m.once(ctx, o, cfg, rep, run); err != nil {
				return fmt.Errorf("layout=%s: %w", layout, err)
			}
		}
	}
	return nil
}

func (m mountProp) once(ctx context.Context, o Options, cfg map[string]string, rep int, run *Run) (err error) {
	base, err := os.MkdirTemp("", "nsfleet-mountprop-")
	if err != nil {
		return err
	}
	dir := filepath.Join(base, "netns")
	os.Mkdir(dir, 0o755)
	var unmount []string
	defer func() {
		for i := len(unmount) - 1; i >= 0; i-- {
			unix.Unmount(unmount[i], unix.MNT_DETACH)
		}
		os.RemoveAll(base)
	}()
	rd := &netns.RunDir{Path: dir}
	if real, err := filepath.EvalSymlinks(dir); err == nil {
		rd.Path = real
	}
	switch cfg["layout"] {
	case "shared", "private":
		if err := unix.Mount(rd.Path, rd.Path, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		unmount = append(unmount, rd.Path)
		prop := uintptr(unix.MS_SHARED)
		if cfg["layout"] == "private" {
			prop = unix.MS_PRIVATE
		}
		if err := unix.Mount("", rd.Path, "", unix.MS_PRIVATE, ""); err != nil {
			return err
		}
		if err := unix.Mount("", rd.Path, "", prop, ""); err != nil {
			return err
		}
	case "parent-shared":
		b := filepath.Dir(rd.Path)
		if err := unix.Mount(b, b, "", unix.MS_BIND, ""); err != nil {
			return err
		}
		unmount = append(unmount, b)
		if err := unix.Mount("", b, "", unix.MS_PRIVATE, ""); err != nil {
			return err
		}
		if err := unix.Mount("", b, "", unix.MS_SHARED, ""); err != nil {
			return err
		}
	}
	// The idle mount namespaces: copies that stay in the same peer groups.
	var idle []*exec.Cmd
	defer func() {
		for _, c := range idle {
			c.Process.Kill()
			c.Wait()
		}
	}()
	for i := 0; i < IdleMountNamespaces; i++ {
		c := exec.Command("unshare", "--mount", "--propagation", "unchanged", "sleep", "3600")
		if err := c.Start(); err != nil {
			return err
		}
		idle = append(idle, c)
	}
	time.Sleep(200 * time.Millisecond) // let them unshare before the first pin
	names := make([]string, 0, o.N)
	defer func() {
		for _, n := range names {
			rd.Unpin(n)
		}
	}()
	self, _ := os.Executable()
	last := time.Now()
	for i := 1; i <= o.N; i++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		h, err := netns.Create(nil)
		if err != nil {
			return err
		}
		name := o.Prefix + strconv.Itoa(i)
		err = rd.Pin(name, h)
		h.Close()
		if err != nil {
			return err
		}
		names = append(names, name)
		if i%o.Mark == 0 {
			now := time.Now()
			run.Samples = append(run.Samples, Sample{Config: cfg, Mark: i, Metric: "add rate", Unit: "namespaces/s", Better: "higher", Rep: rep, Value: float64(o.Mark) / now.Sub(last).Seconds()})
			if d, err := medianRun(9, "unshare", "--mount", "true"); err == nil {
				run.Samples = append(run.Samples, Sample{Config: cfg, Mark: i, Metric: "new mount namespace", Unit: "ms", Better: "lower", Rep: rep, Value: d})
			}
			if d, err := medianRun(9, self, "--run-dir", rd.Path, "exec", name, "--", "true"); err == nil {
				run.Samples = append(run.Samples, Sample{Config: cfg, Mark: i, Metric: "setns exec", Unit: "ms", Better: "lower", Rep: rep, Value: d})
			}
			if o.Progress != nil {
				o.Progress(ConfigKey(cfg, run.Keys), rep, i, o.N)
			}
			last = time.Now()
		}
	}
	start := time.Now()
	for _, n := range names {
		if err := rd.Unpin(n); err != nil {
			return err
		}
	}
	run.Samples = append(run.Samples, Sample{Config: cfg, Metric: "delete rate", Unit: "namespaces/s", Better: "higher", Rep: rep, Value: float64(len(names)) / time.Since(start).Seconds()})
	names = nil
	return nil
}

// medianRun runs a command k times and returns the median wall time in ms.
func medianRun(k int, name string, args ...string) (float64, error) {
	ds := make([]float64, 0, k)
	for i := 0; i < k; i++ {
		t := time.Now()
		if err := exec.Command(name, args...).Run(); err != nil {
			return 0, err
		}
		ds = append(ds, float64(time.Since(t).Microseconds())/1e3)
	}
	sort.Float64s(ds)
	return ds[k/2], nil
}
