package spec

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"strings"
	"testing"
)

func TestParseFakeRoutersExample(t *testing.T) {
	f, err := Load("../examples/fake-routers.yaml", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := len(f.Namespaces); got != 3000 {
		t.Fatalf("got %d namespaces, want 3000", got)
	}
	ns := f.Namespaces[16]
	if ns.Name != "bar-17" || !ns.Loopback {
		t.Fatalf("namespace 17 = %+v", ns)
	}
	if len(ns.Sysctls) != 1 || ns.Sysctls[0] != (Sysctl{"net.ipv4.ip_forward", "1"}) {
		t.Fatalf("sysctls = %+v", ns.Sysctls)
	}
	want := []Veth{{Host: "qro-17", Peer: "qri-17"}, {Host: "qgo-17", Peer: "qgi-17"}}
	if len(ns.Veths) != 2 || ns.Veths[0].Host != want[0].Host || ns.Veths[1].Peer != want[1].Peer {
		t.Fatalf("veths = %+v", ns.Veths)
	}
	if got, ok := f.Lookup("bar-3000"); !ok || got.Origin.Index != 3000 || got.Origin.Line != 3 {
		t.Fatalf("Lookup(bar-3000) = %+v, %v", got, ok)
	}
}

func TestParseLabExample(t *testing.T) {
	f, err := Load("../examples/lab.yaml", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Names(); strings.Join(got, ",") != "lab-r1,lab-r2,lab-r3,lab-r4,lab-dhcp" {
		t.Fatalf("names = %v", got)
	}
	r2, _ := f.Lookup("lab-r2")
	v := r2.Veths[0]
	if v.MTU != 1400 || !v.Up || !v.HostIPv6Off || v.HostAddrs[0] != netip.MustParsePrefix("198.18.0.9/30") || v.PeerAddrs[0] != netip.MustParsePrefix("198.18.0.10/30") {
		t.Fatalf("veth = %+v", v)
	}
	if r := r2.Routes[0]; r.To != netip.MustParsePrefix("0.0.0.0/0") || r.Via != netip.MustParseAddr("198.18.0.9") {
		t.Fatalf("route = %+v", r)
	}
	dhcp, _ := f.Lookup("lab-dhcp")
	if dhcp.Loopback {
		t.Fatal("lab-dhcp: loopback should be down")
	}
}

func TestExpand(t *testing.T) {
	cases := []struct {
		in, want string
		i        int
	}{
		{"bar-{i}", "bar-7", 7},
		{"{i/256}.{i%256}", "1.4", 260},
		{"{i*4+1}", "41", 10},
		{"x{{i}}", "x{i}", 3},
		{"{ i + 2 }", "5", 3},
		{"{name}-h", "ns-h", 1},
	}
	for _, c := range cases {
		got, err := expand(c.in, expandEnv{i: c.i, name: "ns", hasName: true})
		if err != nil || got != c.want {
			t.Errorf("expand(%q, %d) = %q, %v; want %q", c.in, c.i, got, err, c.want)
		}
	}
	for _, bad := range []string{"{j}", "{i/0}", "{i+}", "{i", "i}", "{i^2}"} {
		if got, err := expand(bad, expandEnv{i: 1}); err == nil {
			t.Errorf("expand(%q) = %q, want an error", bad, got)
		}
	}
}

// TestRefused checks that every bad input from RELIABILITY.md is refused with
// the right line, before anything could be created.
func TestRefused(t *testing.T) {
	cases := []struct {
		name, yaml, want string
		line             int
		opts             Options
	}{
		{"empty name", "namespaces:\n  - name: \"\"\n", `missing 'name'`, 2, Options{}},
		{"dot", "namespaces:\n  - name: \".\"\n", `namespace name "." is not allowed`, 2, Options{}},
		{"dotdot", "namespaces:\n  - name: \"..\"\n", `not allowed`, 2, Options{}},
		{"slash", "namespaces:\n  - name: \"a/{i}\"\n    count: 2\n", `index 1: namespace name "a/1" contains '/'`, 2, Options{}},
		{"long", "namespaces:\n  - name: \"" + strings.Repeat("x", 256) + "\"\n", "above 255", 2, Options{}},
		{"template too long", "namespaces:\n  - name: \"" + strings.Repeat("x", 254) + "{i}\"\n    count: 10\n", "index 10", 2, Options{}},
		{"ifname long", "namespaces:\n  - name: a\n    veths:\n      - host: abcdefghijklmnop\n        peer: p\n", "above the kernel's 15", 4, Options{}},
		{"ifname colon", "namespaces:\n  - name: a\n    veths:\n      - host: h\n        peer: \"p:1\"\n", `contains ':'`, 4, Options{}},
		{"ifname space", "namespaces:\n  - name: a\n    veths:\n      - host: \"h 1\"\n        peer: p\n", `contains ' '`, 4, Options{}},
		{"ifname dot", "namespaces:\n  - name: a\n    veths:\n      - host: \".\"\n        peer: p\n", `not allowed`, 4, Options{}},
		{"ifname template overflows", "namespaces:\n  - name: \"n{i}\"\n    count: 100000\n    veths:\n      - host: \"abcdefghij-{i}\"\n        peer: p\n", `index 10000: veth host end: interface name "abcdefghij-10000"`, 5, Options{}},
		{"dup ns across templates", "namespaces:\n  - name: \"a{i}\"\n    count: 3\n  - name: a2\n", `namespace "a2" is also produced by`, 4, Options{}},
		{"dup host if", "namespaces:\n  - name: a\n    veths: [{host: h, peer: p}]\n  - name: b\n    veths: [{host: h, peer: p}]\n", `host interface "h" is also produced by`, 4, Options{}},
		{"dup peer", "namespaces:\n  - name: a\n    veths: [{host: h1, peer: p}, {host: h2, peer: p}]\n", `peer interface "p" appears twice`, 3, Options{}},
		{"peer lo", "namespaces:\n  - name: a\n    veths: [{host: h1, peer: lo}]\n", `peer interface "lo" appears twice`, 3, Options{}},
		{"sysctl outside net", "namespaces:\n  - name: a\n    sysctls: {kernel.pid_max: \"1\"}\n", "only per-namespace net.* keys", 2, Options{}},
		{"sysctl global", "namespaces:\n  - name: a\n    sysctls: {net.core.rmem_max: \"1\"}\n", "machine-wide", 2, Options{}},
		{"sysctl newline", "namespaces:\n  - name: a\n    sysctls: {net.ipv4.ip_forward: \"1\\n\"}\n", "newline", 2, Options{}},
		{"sysctl equals", "namespaces:\n  - name: a\n    sysctls: {net.ipv4.ip_forward: \"a=b\"}\n", "'='", 2, Options{}},
		{"sysctl dotdot", "namespaces:\n  - name: a\n    sysctls: {net.ipv4..x: \"1\"}\n", "empty component", 2, Options{}},
		{"not yaml", "namespaces: [\n", "did not find", 1, Options{}},
		{"unknown key", "namespaces:\n  - name: a\n    cuont: 3\n", "field cuont not found", 3, Options{}},
		{"negative count", "namespaces:\n  - name: \"a{i}\"\n    count: -1\n", "count -1 is negative", 2, Options{}},
		{"count too big", "namespaces:\n  - name: \"a{i}\"\n    count: 20\n", "above the limit of 10", 2, Options{MaxNamespaces: 10}},
		{"count without {i}", "namespaces:\n  - name: a\n    count: 2\n", "no {i} placeholder", 2, Options{}},
		{"wrong type", "namespaces:\n  - name: a\n    count: lots\n", "cannot unmarshal", 3, Options{}},
		{"empty", "", "empty spec", 0, Options{}},
		{"no namespaces", "namespaces: []\n", "no namespaces declared", 1, Options{}},
		{"bad address", "namespaces:\n  - name: a\n    veths: [{host: h, peer: p, host_addresses: [\"10.0.0.1\"]}]\n", "want an address with a prefix length", 3, Options{}},
		{"ipv6 address, host_ipv6 off", "namespaces:\n  - name: a\n    veths: [{host: h, peer: p, host_ipv6: false, host_addresses: [\"fd00::1/64\"]}]\n", "host_ipv6 is false", 3, Options{}},
		{"bad mtu", "namespaces:\n  - name: a\n    veths: [{host: h, peer: p, mtu: 20}]\n", "mtu 20", 3, Options{}},
		{"bad loopback", "namespaces:\n  - name: a\n    loopback: sideways\n", `loopback "sideways"`, 2, Options{}},
		{"route dev unknown", "namespaces:\n  - name: a\n    routes: [{to: default, dev: eth9}]\n", `route dev "eth9"`, 3, Options{}},
		{"route mixed families", "namespaces:\n  - name: a\n    routes: [{to: \"10.0.0.0/8\", via: \"fe80::1\"}]\n", "mixes IPv4 and IPv6", 3, Options{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := Parse("s.yaml", []byte(c.yaml), c.opts)
			if err == nil {
				t.Fatalf("accepted; want an error containing %q", c.want)
			}
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v does not match ErrInvalid", err)
			}
			var se *Error
			if !errors.As(err, &se) {
				t.Fatalf("error %T is not *spec.Error", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Errorf("error %q does not contain %q", err, c.want)
			}
			if se.Line != c.line {
				t.Errorf("error %q: line %d, want %d", err, se.Line, c.line)
			}
			if !strings.HasPrefix(err.Error(), "s.yaml:") {
				t.Errorf("error %q does not start with the file name", err)
			}
		})
	}
}

func TestSysctlPath(t *testing.T) {
	if got := SysctlPath("net.ipv4.conf.eth0/100.forwarding"); got != "net/ipv4/conf/eth0.100/forwarding" {
		t.Fatal(got)
	}
	f, err := Parse("s.yaml", []byte("namespaces:\n  - name: a\n    sysctls: {net/ipv4/ip_forward: 1}\n"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if got := f.Namespaces[0].Sysctls[0]; got != (Sysctl{"net.ipv4.ip_forward", "1"}) {
		t.Fatalf("%+v", got)
	}
}

func FuzzParse(f *testing.F) {
	f.Add([]byte("namespaces:\n  - name: \"bar-{i}\"\n    count: 3\n    sysctls: {net.ipv4.ip_forward: \"1\"}\n    veths: [{host: \"h{i}\", peer: p}]\n"))
	f.Add([]byte("namespaces:\n  - name: \"x{i*4+1}\"\n    count: 2\n    routes: [{to: default, via: 10.0.0.1}]\n"))
	f.Add([]byte("namespaces: [{name: a}, {name: a}]"))
	f.Add([]byte("{"))
	f.Add([]byte("# a fleet\nnamespaces:\n  - name: a\n    veths:\n      - host: ha\n        peer: p\n  # between\n  - name: b\n    routes:\n      - to: default\n        dev: lo\n"))
	f.Add([]byte("---\nnamespaces:\n- name: a\n- name: b\n  count: 1\n"))
	f.Add([]byte("namespaces:\n  - name: \"r{i}\"\n    count: 3\n    bridges: [{name: br0, ports: [e0]}]\nlinks:\n  - a: \"r{i}:e1\"\n    b: \"r{i+1}:e0\"\n    count: 2\n  - {a: r3:e1, b: r1:e0, a_addresses: [10.0.0.0/31]}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		fl, err := Parse("fuzz.yaml", data, Options{MaxNamespaces: 200})
		// The per-item parser and the whole-document one must agree.
		if _, ok := splitItems(data); ok {
			whole, werr := parseWhole("fuzz.yaml", data, Options{MaxNamespaces: 200})
			switch {
			case (err == nil) != (werr == nil):
				t.Fatalf("per item: %v; whole document: %v", err, werr)
			case err == nil && !reflect.DeepEqual(fl.Namespaces, whole.Namespaces):
				t.Fatalf("per item and whole document differ:\n%+v\n%+v", fl.Namespaces, whole.Namespaces)
			}
		}
		if err != nil {
			var se *Error
			if !errors.As(err, &se) {
				t.Fatalf("error of type %T: %v", err, err)
			}
			return
		}
		seen := map[string]bool{}
		for _, ns := range fl.Namespaces {
			if ValidNamespaceName(ns.Name) != nil || seen[ns.Name] {
				t.Fatalf("accepted bad or duplicate name %q", ns.Name)
			}
			seen[ns.Name] = true
			for _, v := range ns.Veths {
				if ValidInterfaceName(v.Host) != nil || ValidInterfaceName(v.Peer) != nil {
					t.Fatalf("accepted bad interface name %q/%q", v.Host, v.Peer)
				}
			}
			for _, s := range ns.Sysctls {
				if ValidSysctl(s.Key, s.Value) != nil {
					t.Fatalf("accepted bad sysctl %q=%q", s.Key, s.Value)
				}
			}
		}
	})
}

func TestProcesses(t *testing.T) {
	y := "namespaces:\n  - name: \"qdhcp-{i}\"\n    count: 2\n    processes:\n      - name: dnsmasq\n        command: [\"dnsmasq\", \"--no-daemon\", \"--conf-file=/etc/qdhcp/{name}.conf\"]\n        restart: always\n      - name: helper\n        command: [sleep, \"100{i}\"]\n"
	f, err := Parse("p.yaml", []byte(y), Options{})
	if err != nil {
		t.Fatal(err)
	}
	ps := f.Namespaces[1].Processes
	if len(ps) != 2 || ps[0].Command[2] != "--conf-file=/etc/qdhcp/qdhcp-2.conf" || ps[0].Restart != RestartAlways || ps[1].Restart != RestartOnFailure || ps[1].Command[1] != "1002" {
		t.Fatalf("%+v", ps)
	}
	for _, bad := range []string{
		"namespaces:\n  - name: a\n    processes: [{name: x}]\n",
		"namespaces:\n  - name: a\n    processes: [{name: \"x/y\", command: [true]}]\n",
		"namespaces:\n  - name: a\n    processes: [{name: x, command: [true], restart: sometimes}]\n",
		"namespaces:\n  - name: a\n    processes: [{name: x, command: [true]}, {name: x, command: [true]}]\n",
	} {
		if _, err := Parse("p.yaml", []byte(bad), Options{}); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

// neutronSpec writes n routers as scripts/neutron-spec.sh does: one
// template per router (heterogeneous), or one template of count n.
func neutronSpec(n int, templated bool) []byte {
	var b strings.Builder
	b.WriteString("namespaces:\n")
	if templated {
		fmt.Fprintf(&b, "  - name: \"qrouter-{i}\"\n    count: %d\n    sysctls:\n      net.ipv4.ip_forward: \"1\"\n    veths:\n"+
			"      - host: \"qr{i}\"\n        peer: \"qr-in\"\n        up: true\n        host_ipv6: false\n"+
			"        host_addresses: [\"10.{i/256}.{i%%256}.1/30\"]\n        peer_addresses: [\"10.{i/256}.{i%%256}.2/30\"]\n"+
			"      - host: \"qg{i}\"\n        peer: \"qg-in\"\n        up: true\n        host_ipv6: false\n"+
			"        peer_addresses: [\"100.{i/65536+64}.{i/256%%256}.{i%%256}/10\"]\n"+
			"    routes:\n      - to: default\n        via: 100.64.0.1\n", n)
		return []byte(b.String())
	}
	for i := 1; i <= n; i++ {
		a, c := i/256, i%256
		fmt.Fprintf(&b, "  - name: \"qrouter-%08x-%012x\"\n    sysctls:\n      net.ipv4.ip_forward: \"1\"\n    veths:\n"+
			"      - host: \"qr%d\"\n        peer: \"qr-in\"\n        up: true\n        host_ipv6: false\n"+
			"        host_addresses: [\"10.%d.%d.1/30\"]\n        peer_addresses: [\"10.%d.%d.2/30\"]\n"+
			"      - host: \"qg%d\"\n        peer: \"qg-in\"\n        up: true\n        host_ipv6: false\n"+
			"        peer_addresses: [\"100.%d.%d.%d/10\"]\n"+
			"    routes:\n      - to: default\n        via: 100.64.0.1\n", i*2654435761%4294967296, i, i, a, c, a, c, i, 64+i/65536, a%256, c)
	}
	return []byte(b.String())
}

// The heterogeneous fleet parsed per item and as one document must be the
// same fleet; and the benchmarks below compare their costs with a
// templated fleet of the same shape.
func TestHeterogeneousSameBothWays(t *testing.T) {
	data := neutronSpec(300, false)
	if _, ok := splitItems(data); !ok {
		t.Fatal("a plain block spec was not cut into items")
	}
	a, err := Parse("h.yaml", data, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := parseWhole("h.yaml", data, Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Namespaces, b.Namespaces) || len(a.Namespaces) != 300 {
		t.Fatalf("per item and whole document differ (%d, %d namespaces)", len(a.Namespaces), len(b.Namespaces))
	}
	if a.Namespaces[299].Origin.Line != 1+299*18+1 {
		t.Errorf("line of the last router %d, want %d", a.Namespaces[299].Origin.Line, 1+299*18+1)
	}
}

func benchmarkParse(b *testing.B, data []byte, parse func(string, []byte, Options) (*Fleet, error)) {
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := parse("b.yaml", data, Options{}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkParseTemplated5000(b *testing.B) { benchmarkParse(b, neutronSpec(5000, true), Parse) }
func BenchmarkParseHeterogeneous5000(b *testing.B) {
	benchmarkParse(b, neutronSpec(5000, false), Parse)
}
func BenchmarkParseHeterogeneousWhole5000(b *testing.B) {
	benchmarkParse(b, neutronSpec(5000, false), parseWhole)
}

// TestProcessConfig: a process's config is expanded per namespace
// ({name}, {loopback}, {i}), every other brace stays (daemon syntax), and
// {config} stays in the command for the supervisor.
func TestProcessConfig(t *testing.T) {
	y := `namespaces:
  - name: "r{i}"
    count: 2
    loopback_addresses: ["10.255.0.{i}/32"]
    processes:
      - name: bird
        command: [bird, -f, -c, "{config}", -s, "/run/lab/{name}.ctl"]
        config: |
          # {name}
          router id {loopback};
          protocol ospf v2 { area 0 { interface "eth*" { hello {i+1}; }; }; }
          literal { not a placeholder } and {{ too
`
	f, err := Parse("c.yaml", []byte(y), Options{})
	if err != nil {
		t.Fatal(err)
	}
	p := f.Namespaces[1].Processes[0]
	want := "# r2\nrouter id 10.255.0.2;\nprotocol ospf v2 { area 0 { interface \"eth*\" { hello 3; }; }; }\nliteral { not a placeholder } and {{ too\n"
	if p.Config != want {
		t.Fatalf("config:\n%s\nwant:\n%s", p.Config, want)
	}
	if p.Command[3] != ConfigPlaceholder || p.Command[5] != "/run/lab/r2.ctl" {
		t.Fatalf("command %q", p.Command)
	}
	for bad, why := range map[string]string{
		"namespaces:\n  - name: a\n    processes: [{name: x, command: [cat], config: hi}]\n":                                                         "does not name its file",
		"namespaces:\n  - name: a\n    processes: [{name: x, command: [cat, \"{config}\"]}]\n":                                                       "has none",
		"namespaces:\n  - name: a\n    processes: [{name: x, command: [cat, \"{config}\"], config: \"id {loopback}\"}]\n":                            "needs a loopback address",
		"namespaces:\n  - name: a\n    processes: [{name: x, command: [cat, \"{config}\"], config: \"" + strings.Repeat("x", MaxConfig+1) + "\"}]\n": "at most",
	} {
		_, err := Parse("c.yaml", []byte(bad), Options{})
		if err == nil || !strings.Contains(err.Error(), why) || !strings.Contains(err.Error(), "c.yaml:") {
			t.Errorf("%.60q: %v, want %q with file:line", bad, err, why)
		}
	}
}
