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

// mountProp reproduces report 003 (docs/BACKGROUND.md): with M idle mount namespaces
// that share the run dir's propagation (as services under systemd do),
// every pin is copied into each of them. It adds and deletes N namespaces
// under three run-dir layouts, and times what every `ip netns exec` pays
// (a new mount namespace: unshare -m, copying every mount) against a
// setns-only exec, as the pins pile up.
type mountProp struct{}

func init() {
	register(&Scenario{
		Name:     "mount-propagation",
		Describe: "report 003: add/delete N namespaces with M idle mount namespaces (--idle), per run-dir layout, real/user/sys as time prints them; ip's loop as an engine; new mount namespace vs setns-only exec",
		N:        1000,
		Mark:     250,
		Engines:  []string{"native", "iproute2"},
		Variants: []string{"shared", "parent-shared", "private"},
		Keys:     []string{"engine", "layout"},
		Run:      mountProp{}.Run,
	})
}

// IdleMountNamespaces is M, the idle mount namespaces held open.
var IdleMountNamespaces = 100

func (m mountProp) Run(ctx context.Context, o Options, run *Run) error {
	if _, err := exec.LookPath("unshare"); err != nil {
		run.Skipped = append(run.Skipped, "all: unshare(1) not installed (Debian: util-linux)")
		return nil
	}
	run.Params["idle"] = strconv.Itoa(IdleMountNamespaces)
	run.Notes = append(run.Notes,
		"shared: the run dir is its own shared mount point (iproute2 since the report's first patch); parent-shared: the run dir is a plain directory in a shared mount (systemd's rshared /, iproute2 before it); private: its own private mount point (pins do not propagate, the report's second patch)",
		"add/delete real, user, sys: the whole loop as `time` prints it (iproute2: the ip processes' user and sys; native: this process's)",
		"new mount namespace: time of `unshare --mount true`, the copy every ip netns exec makes; setns exec: `nsfleet exec NAME -- true`",
		"engine=iproute2 is the report's loop (`ip netns add`, then `ip netns del`, one process each) in /run/netns under this run's prefix; today's ip always makes /run/netns its own shared mount, so it runs the shared layout only")
	for _, eng := range o.Engines {
		if why := engineMissing(eng); why != "" {
			run.Skipped = append(run.Skipped, "engine="+eng+": "+why)
			continue
		}
		for _, layout := range o.Variants {
			cfg := map[string]string{"engine": eng, "layout": layout}
			if eng == "iproute2" && layout != "shared" {
				run.Skipped = append(run.Skipped, ConfigKey(cfg, run.Keys)+": today's ip makes /run/netns its own shared mount whatever was there; this layout needs the report's other iproute2 builds (the native engine runs it)")
				continue
			}
			for rep := 0; rep < o.Runs; rep++ {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				o.Log.Info("run", "engine", eng, "layout", layout, "rep", rep+1)
				var err error
				if eng == "iproute2" {
					err = m.iproute2(ctx, o, cfg, rep, run)
				} else {
					err = m.once(ctx, o, cfg, rep, run)
				}
				if err != nil {
					return fmt.Errorf("%s: %w", ConfigKey(cfg, run.Keys), err)
				}
			}
		}
	}
	return nil
}

// startIdle starts the idle mount namespaces: copies of this one that stay
// in its peer groups, as the report's `unshare -m --propagation unchanged`.
func startIdle() (stop func(), err error) {
	var idle []*exec.Cmd
	stop = func() {
		for _, c := range idle {
			c.Process.Kill()
			c.Wait()
		}
	}
	for i := 0; i < IdleMountNamespaces; i++ {
		c := exec.Command("unshare", "--mount", "--propagation", "unchanged", "sleep", "3600")
		if err := c.Start(); err != nil {
			stop()
			return nil, err
		}
		idle = append(idle, c)
	}
	time.Sleep(200 * time.Millisecond) // let them unshare before the first pin
	return stop, nil
}

// clock times a loop as time(1) does: wall, and user and sys of this
// process (children false) or of the children it waited for (true).
type clock struct {
	children bool
	start    time.Time
	ru       unix.Rusage
}

func startClock(children bool) *clock {
	c := &clock{children: children, start: time.Now()}
	c.ru = c.usage()
	return c
}

func (c *clock) usage() unix.Rusage {
	var ru unix.Rusage
	who := unix.RUSAGE_SELF
	if c.children {
		who = unix.RUSAGE_CHILDREN
	}
	unix.Getrusage(who, &ru)
	return ru
}

// record adds "WHAT real/user/sys" samples at mark.
func (c *clock) record(run *Run, cfg map[string]string, rep, mark int, what string) {
	ru := c.usage()
	tv := func(t unix.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	for _, x := range []struct {
		name string
		v    float64
	}{{"real", time.Since(c.start).Seconds()}, {"user", tv(ru.Utime) - tv(c.ru.Utime)}, {"sys", tv(ru.Stime) - tv(c.ru.Stime)}} {
		run.Samples = append(run.Samples, Sample{Config: cfg, Mark: mark, Metric: what + " " + x.name, Unit: "s", Better: "lower", Rep: rep, Value: x.v})
	}
}

// iproute2 is the report's script: M idle mount namespaces, then N `ip
// netns add`, then N `ip netns del`, each loop timed as time(1) prints it.
func (m mountProp) iproute2(ctx context.Context, o Options, cfg map[string]string, rep int, run *Run) error {
	restore := netns.GuardDefaultRunDir()
	defer restore()
	defer cleanupSystem(o.Prefix)
	if ents, err := os.ReadDir(netns.DefaultRunDir); err == nil {
		for _, e := range ents {
			if len(e.Name()) >= len(o.Prefix) && e.Name()[:len(o.Prefix)] == o.Prefix {
				return fmt.Errorf("%s/%s already exists: the prefix %q is taken; refusing to run", netns.DefaultRunDir, e.Name(), o.Prefix)
			}
		}
	}
	stop, err := startIdle()
	if err != nil {
		return err
	}
	defer stop()
	name := func(i int) string { return o.Prefix + "t" + strconv.Itoa(i) }
	ip := func(args ...string) error {
		out, err := exec.CommandContext(ctx, "ip", args...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("ip %v: %v: %s", args, err, out)
		}
		return nil
	}
	c := startClock(true)
	for i := 0; i < o.N; i++ {
		if err := ip("netns", "add", name(i)); err != nil {
			return err
		}
		if (i+1)%o.Mark == 0 && o.Progress != nil {
			o.Progress(ConfigKey(cfg, run.Keys), rep, i+1, o.N)
		}
	}
	c.record(run, cfg, rep, o.N, "add")
	c = startClock(true)
	for i := 0; i < o.N; i++ {
		if err := ip("netns", "del", name(i)); err != nil {
			return err
		}
	}
	c.record(run, cfg, rep, o.N, "delete")
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
	stop, err := startIdle()
	if err != nil {
		return err
	}
	defer stop()
	names := make([]string, 0, o.N)
	defer func() {
		for _, n := range names {
			rd.Unpin(n)
		}
	}()
	self, _ := os.Executable()
	last := time.Now()
	// What time(1) would print for the whole add loop, leaving out the
	// exec measurements at the marks.
	var measured time.Duration
	addClock := startClock(false)
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
			probe := now
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
			measured += last.Sub(probe)
		}
	}
	addClock.start = addClock.start.Add(measured)
	addClock.record(run, cfg, rep, o.N, "add")
	delClock := startClock(false)
	start := time.Now()
	for _, n := range names {
		if err := rd.Unpin(n); err != nil {
			return err
		}
	}
	run.Samples = append(run.Samples, Sample{Config: cfg, Metric: "delete rate", Unit: "namespaces/s", Better: "higher", Rep: rep, Value: float64(len(names)) / time.Since(start).Seconds()})
	delClock.record(run, cfg, rep, len(names), "delete")
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
