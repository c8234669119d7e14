package bench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/spec"
)

// fakeRouter reproduces report 000 (docs/BACKGROUND.md): Neutron's "fake routers"
// (netns, lo up, ip_forward, two veth pairs with the peer created inside),
// timed every mark, in the report's five variants, by several engines.
type fakeRouter struct{}

func init() {
	register(&Scenario{
		Name:     "fake-router",
		Describe: "report 000: netns + lo up + ip_forward + 2 veth pairs, routers/s per mark; engines side by side",
		N:        1000,
		Mark:     250,
		Engines:  []string{"native", "iproute2", "iproute2-batch", "pyroute2", "netlink", "netlink-1q"},
		Variants: []string{"add", "add+exec", "add+2exec", "add+2exec+link", "add+2exec+2link"},
		Keys:     []string{"engine", "variant"},
		Run:      fakeRouter{}.Run,
	})
}

// steps of a variant, as the report's tables add them.
type routerSteps struct {
	loUp, forward bool
	links         int
}

func stepsOf(variant string) routerSteps {
	return map[string]routerSteps{
		"add":             {},
		"add+exec":        {loUp: true},
		"add+2exec":       {loUp: true, forward: true},
		"add+2exec+link":  {loUp: true, forward: true, links: 1},
		"add+2exec+2link": {loUp: true, forward: true, links: 2},
	}[variant]
}

func (f fakeRouter) Run(ctx context.Context, o Options, run *Run) error {
	engines := o.Engines
	variants := o.Variants
	run.Notes = append(run.Notes,
		"native uses its own run dir ("+o.RunDir+"); the iproute2 and pyroute2 engines must use /run/netns, under the prefix "+o.Prefix,
		"iproute2-batch: ip -batch expresses netns add and link add, but lo up and sysctl still need 'netns exec' lines, a process each",
		"netlink: vishvananda/netns and vishvananda/netlink as Go tools use them (NewNamed pins in /run/netns, a handle per namespace, sysctls through /proc/sys), with the native engine's worker count; netlink-1q: the same with one queue per veth end, as nsfleet")
	// Refuse to run where cleanup could remove what others made.
	if ents, err := os.ReadDir(netns.DefaultRunDir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), o.Prefix) {
				return fmt.Errorf("%s/%s already exists: the prefix %q is taken; refusing to run (pick another with a different process, or remove it)", netns.DefaultRunDir, e.Name(), o.Prefix)
			}
		}
	}
	for _, eng := range engines {
		if why := engineMissing(eng); why != "" {
			run.Skipped = append(run.Skipped, "engine="+eng+": "+why)
			continue
		}
		for _, v := range variants {
			for rep := 0; rep < o.Runs; rep++ {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				cfg := map[string]string{"engine": eng, "variant": v}
				o.Log.Info("run", "engine", eng, "variant", v, "rep", rep+1, "of", o.Runs)
				var err error
				switch eng {
				case "native":
					err = f.native(ctx, o, cfg, rep, run)
				default:
					err = f.external(ctx, o, eng, cfg, rep, run)
				}
				if err != nil {
					return fmt.Errorf("%s: %w", ConfigKey(cfg, run.Keys), err)
				}
			}
		}
	}
	return nil
}

func engineMissing(eng string) string {
	switch eng {
	case "iproute2", "iproute2-batch":
		if _, err := exec.LookPath("ip"); err != nil {
			return "ip(8) not installed (Debian: iproute2)"
		}
	case "pyroute2":
		if err := exec.Command(systemPython, "-c", "import pyroute2").Run(); err != nil {
			return "python3-pyroute2 not installed (Debian: apt-get install python3-pyroute2)"
		}
	}
	return ""
}

// systemPython is Debian's interpreter, the one python3-pyroute2 is for.
const systemPython = "/usr/bin/python3"

func (f fakeRouter) spec(o Options, v string) (*spec.Fleet, error) {
	st := stepsOf(v)
	var b strings.Builder
	fmt.Fprintf(&b, "namespaces:\n  - name: \"%sr{i}\"\n    count: %d\n", o.Prefix, o.N)
	if !st.loUp {
		b.WriteString("    loopback: down\n")
	}
	if st.forward {
		b.WriteString("    sysctls: {net.ipv4.ip_forward: \"1\"}\n")
	}
	if st.links > 0 {
		b.WriteString("    veths:\n")
		for k := 0; k < st.links; k++ {
			fmt.Fprintf(&b, "      - {host: \"%s%c{i}\", peer: \"q%c{i}\"}\n", o.Prefix, "og"[k], "rg"[k])
		}
	}
	return spec.Parse("fake-router", []byte(b.String()), spec.Options{})
}

func (f fakeRouter) native(ctx context.Context, o Options, cfg map[string]string, rep int, run *Run) error {
	fl, err := f.spec(o, cfg["variant"])
	if err != nil {
		return err
	}
	return upNative(ctx, o, fl, cfg, rep, run)
}

// upNative makes fl with nsfleet's engine in o's run dir, records the rate
// and each step's time per mark and the time of down, and removes it.
func upNative(ctx context.Context, o Options, fl *spec.Fleet, cfg map[string]string, rep int, run *Run) error {
	rd, err := netns.OpenRunDir(o.RunDir, true)
	if err != nil {
		return err
	}
	steps := &fleet.StepTimes{Mark: o.Mark}
	done := 0
	opts := fleet.UpOptions{Mark: o.Mark, Steps: steps, Options: fleet.Options{RunDir: rd, Workers: o.Workers, OnResult: func(fleet.Result) {
		done++
		if o.Progress != nil && done%o.Mark == 0 {
			o.Progress(ConfigKey(cfg, run.Keys), rep, done, o.N)
		}
	}}}
	sum, err := fleet.Up(ctx, fl, opts)
	defer cleanupNative(rd, o.Prefix)
	if err != nil {
		return err
	}
	if err := sum.Err(); err != nil {
		return fmt.Errorf("%v (%v)", err, errors.Join(sum.Errors...))
	}
	for i, r := range sum.MarkRates() {
		run.Samples = append(run.Samples, Sample{Config: cfg, Mark: (i + 1) * o.Mark, Metric: "rate", Unit: "routers/s", Better: "higher", Rep: rep, Value: r})
	}
	for i, m := range steps.PerMark() {
		for _, st := range fleet.Steps {
			if d, ok := m[st]; ok && d > 0 {
				run.Samples = append(run.Samples, Sample{Config: cfg, Mark: (i + 1) * o.Mark, Metric: "step " + st, Unit: "us", Better: "lower", Rep: rep, Value: float64(d.Nanoseconds()) / 1e3})
			}
		}
	}
	t := time.Now()
	rep2, err := fleet.Down(ctx, fleet.Selector{Prefix: o.Prefix}, fleet.DownOptions{Options: fleet.Options{RunDir: rd}, Wait: true})
	if err == nil && len(rep2.Pending) == 0 {
		run.Samples = append(run.Samples, Sample{Config: cfg, Metric: "down (until freed)", Unit: "s", Better: "lower", Rep: rep, Value: time.Since(t).Seconds()})
	}
	return err
}

func cleanupNative(rd *netns.RunDir, prefix string) {
	fleet.Down(context.Background(), fleet.Selector{Prefix: prefix}, fleet.DownOptions{Options: fleet.Options{RunDir: rd, Adopt: true}, Wait: true, Timeout: time.Minute})
}

// cleanupSystem removes what an external engine made in /run/netns.
func cleanupSystem(prefix string) {
	rd, err := netns.OpenRunDir(netns.DefaultRunDir, false)
	if err != nil {
		return
	}
	// Adopt: ip made them, so they carry no nsfleet mark; the prefix is ours.
	fleet.Down(context.Background(), fleet.Selector{Prefix: prefix}, fleet.DownOptions{Options: fleet.Options{RunDir: rd, Adopt: true}, Wait: true, Timeout: time.Minute})
}

// external runs an engine that is another program, timing every mark.
func (f fakeRouter) external(ctx context.Context, o Options, eng string, cfg map[string]string, rep int, run *Run) error {
	defer netns.GuardDefaultRunDir()()
	defer cleanupSystem(o.Prefix)
	st := stepsOf(cfg["variant"])
	start := time.Now()
	last := start
	for from := 1; from <= o.N; from += o.Mark {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		to := min(from+o.Mark-1, o.N)
		var err error
		switch eng {
		case "iproute2":
			err = ipScript(ctx, o.Prefix, st, from, to)
		case "iproute2-batch":
			err = ipBatch(ctx, o.Prefix, st, from, to)
		case "pyroute2":
			err = pyroute2Script(ctx, o.Prefix, st, from, to)
		case "netlink", "netlink-1q":
			err = netlinkRouters(ctx, o.Prefix, st, from, to, o.Workers, eng == "netlink-1q")
		}
		if err != nil {
			return err
		}
		now := time.Now()
		if to-from+1 == o.Mark {
			run.Samples = append(run.Samples, Sample{Config: cfg, Mark: to, Metric: "rate", Unit: "routers/s", Better: "higher", Rep: rep, Value: float64(o.Mark) / now.Sub(last).Seconds()})
		}
		last = now
		if o.Progress != nil {
			o.Progress(ConfigKey(cfg, run.Keys), rep, to, o.N)
		}
	}
	return nil
}

// ipScript runs the report's command sequence, one ip process per command.
func ipScript(ctx context.Context, prefix string, st routerSteps, from, to int) error {
	for i := from; i <= to; i++ {
		ns := prefix + "r" + strconv.Itoa(i)
		cmds := [][]string{{"ip", "netns", "add", ns}}
		if st.loUp {
			cmds = append(cmds, []string{"ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"})
		}
		if st.forward {
			cmds = append(cmds, []string{"ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv4.ip_forward=1"})
		}
		for k := 0; k < st.links; k++ {
			cmds = append(cmds, []string{"ip", "link", "add", fmt.Sprintf("%s%c%d", prefix, "og"[k], i), "type", "veth", "peer", "name", fmt.Sprintf("q%c%d", "rg"[k], i), "netns", ns})
		}
		for _, c := range cmds {
			if out, err := exec.CommandContext(ctx, c[0], c[1:]...).CombinedOutput(); err != nil {
				return fmt.Errorf("%s: %v: %s", strings.Join(c, " "), err, bytes.TrimSpace(out))
			}
		}
	}
	return nil
}

// ipBatch does the same through one `ip -batch` per mark.
func ipBatch(ctx context.Context, prefix string, st routerSteps, from, to int) error {
	var b strings.Builder
	for i := from; i <= to; i++ {
		ns := prefix + "r" + strconv.Itoa(i)
		fmt.Fprintf(&b, "netns add %s\n", ns)
		if st.loUp {
			fmt.Fprintf(&b, "netns exec %s ip link set lo up\n", ns)
		}
		if st.forward {
			fmt.Fprintf(&b, "netns exec %s sysctl -q -w net.ipv4.ip_forward=1\n", ns)
		}
		for k := 0; k < st.links; k++ {
			fmt.Fprintf(&b, "link add %s%c%d type veth peer name q%c%d netns %s\n", prefix, "og"[k], i, "rg"[k], i, ns)
		}
	}
	c := exec.CommandContext(ctx, "ip", "-batch", "-")
	c.Stdin = strings.NewReader(b.String())
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("ip -batch: %v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// pyroute2Program does the work the way OpenStack Neutron does it with
// pyroute2: netns.create, NetNS for lo, setns for the sysctl, IPRoute for
// the veths with the peer placed by namespace.
const pyroute2Program = `
import sys
from pyroute2 import netns, NetNS, IPRoute
prefix, lo, fwd, links, a, b = sys.argv[1], sys.argv[2] == "1", sys.argv[3] == "1", int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
ipr = IPRoute()
for i in range(a, b + 1):
    ns = "%sr%d" % (prefix, i)
    netns.create(ns)
    if lo:
        with NetNS(ns) as n:
            n.link("set", index=n.link_lookup(ifname="lo")[0], state="up")
    if fwd:
        netns.pushns(ns)
        with open("/proc/sys/net/ipv4/ip_forward", "w") as f:
            f.write("1")
        netns.popns()
    for k in range(links):
        ipr.link("add", ifname="%s%s%d" % (prefix, "og"[k], i), kind="veth", peer={"ifname": "q%s%d" % ("rg"[k], i), "net_ns_fd": ns})
ipr.close()
`

func pyroute2Script(ctx context.Context, prefix string, st routerSteps, from, to int) error {
	b := func(x bool) string {
		if x {
			return "1"
		}
		return "0"
	}
	c := exec.CommandContext(ctx, systemPython, "-c", pyroute2Program, prefix, b(st.loUp), b(st.forward), strconv.Itoa(st.links), strconv.Itoa(from), strconv.Itoa(to))
	c.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("pyroute2: %v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}
