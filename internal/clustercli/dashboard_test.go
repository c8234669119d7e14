package clustercli

import (
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/cluster/sim"
	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
)

// dashboardQueries reads every query of the Grafana dashboard, with its
// variables set as Grafana would for "all nodes" over the last minutes.
func dashboardQueries(t *testing.T) map[string]string {
	b, err := os.ReadFile("../../contrib/grafana/nsfleet.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	r := strings.NewReplacer("$node", ".*", "$__rate_interval", "1m", "$__range", "10m")
	out := map[string]string{}
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for i, tg := range p.Targets {
			out[fmt.Sprintf("%s #%d", p.Title, i+1)] = r.Replace(tg.Expr)
		}
	}
	return out
}

// TestDashboard runs Debian's Prometheus against a 3-node sim's agents
// (with the alerting rules loaded), makes the sim live through a failover,
// and checks that every query of the Grafana dashboard returns data.
func TestDashboard(t *testing.T) {
	nstest.RequireRoot(t)
	prom, err := exec.LookPath("prometheus")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI installs Debian's prometheus; it is missing")
		}
		t.Skip("Prometheus (Debian's prometheus) is not installed")
	}
	queries := dashboardQueries(t)
	dir, st := upSim(t, 2*time.Second)

	// Prometheus in the hub's namespace, from which every node's metrics
	// address is reachable.
	work := t.TempDir()
	var targets []string
	for _, n := range st.Nodes {
		targets = append(targets, `"`+sim.MetricsAddr(n.Index)+`"`)
	}
	rules, _ := filepath.Abs("../../contrib/prometheus/nsfleet-rules.yml")
	conf := fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [%q]
scrape_configs:
  - job_name: nsfleet-agent
    static_configs: [{targets: [%s]}]
`, rules, strings.Join(targets, ", "))
	if err := os.WriteFile(filepath.Join(work, "prometheus.yml"), []byte(conf), 0o644); err != nil {
		t.Fatal(err)
	}
	const web = "127.0.0.1:9490"
	cmd := exec.Command(prom, "--config.file", filepath.Join(work, "prometheus.yml"), "--storage.tsdb.path", filepath.Join(work, "data"),
		"--web.listen-address", web, "--log.level", "warn")
	logf, _ := os.Create(filepath.Join(work, "prometheus.log"))
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	hub, err := netns.OpenPath(st.HubPin)
	if err != nil {
		t.Fatal(err)
	}
	defer hub.Close()
	if err := netns.Do(hub, cmd.Start); err != nil { // the child is forked from the thread in the hub
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(work, "prometheus.log"))
			t.Logf("prometheus log:\n%s", b)
		}
	})
	query := func(q string) (int, string) {
		// Prometheus may still be starting (its storage first): not
		// listening yet is "no answer yet", not a failure.
		resp, err := tryHTTPGetIn(st.HubPin, web, "/api/v1/query?query="+url.QueryEscape(q))
		if err != nil {
			return 0, "prometheus: " + err.Error()
		}
		_, body, _ := strings.Cut(resp, "\r\n\r\n")
		var r struct {
			Status string `json:"status"`
			Error  string `json:"error"`
			Data   struct {
				Result []json.RawMessage `json:"result"`
			} `json:"data"`
		}
		if err := json.Unmarshal([]byte(body), &r); err != nil {
			return 0, fmt.Sprintf("%v: %.200s", err, resp)
		}
		if r.Status != "success" {
			return 0, r.Error
		}
		return len(r.Data.Result), ""
	}

	prefix := nstest.Prefix(t)
	specFile := filepath.Join(t.TempDir(), "routers.yaml")
	if err := os.WriteFile(specFile, []byte(nstest.FakeRouters(prefix, 30)), 0o644); err != nil {
		t.Fatal(err)
	}
	must(t, "cluster", "apply", "-f", specFile)
	waitFor(t, "all ready", 30*time.Second, func() string {
		if r := status(t); r.Ready != 30 {
			return fmt.Sprintf("%d ready", r.Ready)
		}
		return ""
	})
	waitFor(t, "every agent scraped", 30*time.Second, func() string {
		if n, e := query(`up{job="nsfleet-agent"} == 1`); n != 3 {
			return fmt.Sprintf("%d up %s", n, e)
		}
		return ""
	})
	// A failover, for the failover panels.
	must(t, "sim", "kill", "node-3", "--dir", dir)
	waitFor(t, "failover done", 30*time.Second, func() string {
		if n, e := query(`sum(nsfleet_failover_duration_seconds_count) > 0`); n == 0 {
			return "no failover recorded " + e
		}
		return ""
	})
	time.Sleep(3 * time.Second) // a few more scrapes for the rates
	for name, q := range queries {
		if n, e := query(q); n == 0 {
			t.Errorf("panel %s: no data from %s %s", name, q, e)
		}
	}
	// And the failover alert fired from the rules Prometheus loaded.
	waitFor(t, "NsfleetFailover alert", 10*time.Second, func() string {
		if n, e := query(`ALERTS{alertname="NsfleetFailover"}`); n == 0 {
			return "not firing " + e
		}
		return ""
	})
}

// TestRules checks the alerting rules with promtool, and runs their unit
// tests (contrib/prometheus/nsfleet-rules.test.yml).
func TestRules(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("CI installs Debian's prometheus (promtool); it is missing")
		}
		t.Skip("promtool (Debian's prometheus) is not installed")
	}
	for _, args := range [][]string{{"check", "rules", "nsfleet-rules.yml"}, {"test", "rules", "nsfleet-rules.test.yml"}} {
		cmd := exec.Command(promtool, args...)
		cmd.Dir = "../../contrib/prometheus"
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}
