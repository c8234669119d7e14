package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/nsfleet/nsfleet/internal/companion"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/fleet"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/spec"
)

// failover is the moment of the 2014 Neutron report (docs/BACKGROUND.md):
// a gateway dies and the survivors re-create its routers. It runs a real
// three-node cluster on this machine (nsfleet sim: three etcd members, an
// agent per node), applies N fake routers, kills one node (power loss) and
// times until every one of its routers is present on a survivor, exactly
// once, from the nodes' own mount tables. The baseline, in the same run:
// `nsfleet up` of as many routers on one node.
type failover struct{}

// Failover's fixed shape: three nodes, as the 2014 report's gateways (docs/BACKGROUND.md).
const (
	failoverNodes = 3
	failoverTTL   = 5 * time.Second // the agent's default lease
)

func init() {
	register(&Scenario{
		Name:     "failover",
		Describe: "report 000's failover: 3 sim nodes, kill one, time until its routers are ready on the survivors; beside a one-node up of as many",
		N:        1500,
		Mark:     1500,
		Engines:  []string{"cluster"},
		Variants: []string{"kill"},
		Keys:     []string{"engine", "variant"},
		Run:      failover{}.Run,
	})
}

func (f failover) Run(ctx context.Context, o Options, run *Run) error {
	bin, err := companion.Cluster.Find()
	if err != nil {
		run.Skipped = append(run.Skipped, "engine=cluster: "+err.Error())
		return nil
	}
	run.Notes = append(run.Notes,
		fmt.Sprintf("%d sim nodes (network + mount namespace each, a real agent inside), 3-member etcd, lease TTL %s; node-2 is killed", failoverNodes, failoverTTL),
		"failover: from the kill until every router of the lost node is in a survivor's mount table, none twice; 'minus TTL' subtracts the lease TTL",
		"one-node up: nsfleet up of as many routers as moved, on this machine, in the same run")
	for rep := 0; rep < o.Runs; rep++ {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		cfg := map[string]string{"engine": "cluster", "variant": "kill"}
		o.Log.Info("run", "scenario", "failover", "rep", rep+1, "of", o.Runs)
		if err := f.once(ctx, o, bin, cfg, rep, run); err != nil {
			return err
		}
	}
	return nil
}

func (f failover) spec(o Options, n int) string {
	return fmt.Sprintf(`namespaces:
  - name: "%[1]sr{i}"
    count: %[2]d
    sysctls: {net.ipv4.ip_forward: "1"}
    veths:
      - {host: "%[1]so{i}", peer: "qr{i}"}
      - {host: "%[1]sg{i}", peer: "qg{i}"}
`, o.Prefix, n)
}

func (f failover) once(ctx context.Context, o Options, bin string, cfg map[string]string, rep int, run *Run) (err error) {
	tmp, err := os.MkdirTemp("", "nsfleet-failover-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	dir := filepath.Join(tmp, "sim")
	cl := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, bin, args...)
		out, err := cmd.Output()
		if ee := (*exec.ExitError)(nil); errors.As(err, &ee) {
			err = fmt.Errorf("nsfleet %s: %s", strings.Join(args, " "), strings.TrimSpace(string(ee.Stderr)))
		}
		return out, err
	}
	if _, err := cl("sim", "up", "--nodes", fmt.Sprint(failoverNodes), "--dir", dir, "--lease-ttl", failoverTTL.String()); err != nil {
		return err
	}
	defer func() {
		if _, derr := cl("sim", "down", "--dir", dir); derr != nil && err == nil {
			err = derr
		}
	}()
	env, err := os.ReadFile(filepath.Join(dir, "etcd.env"))
	if err != nil {
		return err
	}
	etcd := strings.TrimPrefix(strings.TrimSpace(string(env)), "NSFLEET_ETCD=")
	specFile := filepath.Join(tmp, "routers.yaml")
	if err := os.WriteFile(specFile, []byte(f.spec(o, o.N)), 0o644); err != nil {
		return err
	}
	if _, err := cl("cluster", "apply", "-f", specFile, "--etcd", etcd); err != nil {
		return err
	}
	ls := func() (map[string][]string, error) {
		out, err := cl("sim", "ls", "--dir", dir, "-o", "json")
		if err != nil {
			return nil, err
		}
		var m map[string][]string
		return m, json.Unmarshal(out, &m)
	}
	start := time.Now()
	var before map[string][]string
	for {
		if before, err = ls(); err != nil {
			return err
		}
		if n, _ := placed(before, ""); n == o.N {
			break
		}
		if time.Since(start) > 10*time.Minute || ctx.Err() != nil {
			return fmt.Errorf("the cluster did not create %d routers within 10 minutes", o.N)
		}
		time.Sleep(100 * time.Millisecond)
	}
	run.Samples = append(run.Samples, Sample{Config: cfg, Metric: "initial create (3 nodes)", Unit: "s", Better: "lower", Rep: rep, Value: time.Since(start).Seconds()})
	victim := "node-2"
	moved := len(before[victim])
	kill := time.Now()
	if _, err := cl("sim", "kill", victim, "--dir", dir); err != nil {
		return err
	}
	var first time.Duration
	for {
		m, err := ls()
		if err != nil {
			return err
		}
		n, twice := placed(m, victim)
		if twice {
			return errors.New("a router was on two nodes during the failover")
		}
		if n > o.N-moved && first == 0 {
			first = time.Since(kill)
		}
		if n == o.N {
			break
		}
		if time.Since(kill) > 10*time.Minute || ctx.Err() != nil {
			return fmt.Errorf("failover did not finish within 10 minutes (%d of %d placed)", n, o.N)
		}
		time.Sleep(50 * time.Millisecond)
	}
	took := time.Since(kill)
	add := func(metric string, v float64, unit string) {
		run.Samples = append(run.Samples, Sample{Config: cfg, Metric: metric, Unit: unit, Better: "lower", Rep: rep, Value: v})
	}
	add("failover (kill to all ready)", took.Seconds(), "s")
	add("failover minus TTL", (took - failoverTTL).Seconds(), "s")
	add("first moved router ready", first.Seconds(), "s")
	run.Samples = append(run.Samples, Sample{Config: cfg, Metric: "routers moved", Unit: "routers", Better: "higher", Rep: rep, Value: float64(moved)})

	// The baseline, same run: one node's up of as many routers.
	fl, err := spec.Parse("failover-baseline", []byte(f.spec(o, moved)), spec.Options{})
	if err != nil {
		return err
	}
	rd, err := netns.OpenRunDir(o.RunDir, true)
	if err != nil {
		return err
	}
	defer cleanupNative(rd, o.Prefix)
	t := time.Now()
	sum, err := fleet.Up(ctx, fl, fleet.UpOptions{Options: fleet.Options{RunDir: rd, Workers: o.Workers}})
	if err != nil {
		return err
	}
	if err := sum.Err(); err != nil {
		return fmt.Errorf("baseline up: %v", err)
	}
	up := time.Since(t)
	add("one-node up of the moved routers", up.Seconds(), "s")
	add("(failover minus TTL) / one-node up", (took-failoverTTL).Seconds()/up.Seconds(), "x")
	return nil
}

// placed reports how many routers are on a node other than not, and
// whether any is on two.
func placed(m map[string][]string, not string) (int, bool) {
	seen := map[string]int{}
	for node, names := range m {
		if node == not {
			continue
		}
		for _, n := range names {
			seen[n]++
		}
	}
	twice := false
	for _, c := range seen {
		twice = twice || c > 1
	}
	return len(seen), twice
}
