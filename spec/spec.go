// Package spec reads a fleet declaration (YAML), checks all of it, and
// expands its templates into the concrete namespaces nsfleet must make.
//
// Nothing here touches the kernel: a spec that is refused is refused before
// anything is created. Every error carries the file and line of the template
// it comes from, and the index that produced a bad name.
package spec

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// MaxCount bounds one template's count even where the kernel's limit is higher:
// past it, a typo (an extra zero) would try to build a fleet no machine holds.
const MaxCount = 1_000_000

// Options tune Load and Parse. The zero value is the default.
type Options struct {
	// MaxNamespaces refuses a spec whose total count is above it
	// (normally /proc/sys/user/max_net_namespaces). Zero means MaxCount.
	MaxNamespaces int
}

// Fleet is an expanded, validated spec: the namespaces in declaration order.
type Fleet struct {
	Source     string // the file it came from, for messages
	Namespaces []Namespace
	// Links are the links between the fleet's namespaces, each once, in
	// declaration order (each namespace also lists its own).
	Links  []Link
	byName map[string]int
}

// Namespace is one network namespace as the spec wants it.
type Namespace struct {
	Name     string `json:"name"`
	Origin   Origin `json:"origin,omitzero"`
	Loopback bool   `json:"loopback"` // true: lo is up
	// LoopbackAddrs are addresses on lo (a router's own address, /32).
	LoopbackAddrs []netip.Prefix `json:"loopback_addresses,omitempty"`
	Sysctls       []Sysctl       `json:"sysctls,omitempty"`
	Veths         []Veth         `json:"veths,omitempty"`
	Bridges       []Bridge       `json:"bridges,omitempty"`
	// Links are the links with an end in this namespace (see Link).
	Links  []Link  `json:"links,omitempty"`
	Routes []Route `json:"routes,omitempty"`
	// Processes are daemons to run inside the namespace (see package process).
	Processes []Process `json:"processes,omitempty"`
}

// Restart policies of a Process.
const (
	RestartAlways    = "always"
	RestartOnFailure = "on-failure"
	RestartNever     = "never"
)

// Process is a command nsfleet starts inside the namespace and keeps running.
//
// By default it runs as nsfleet does: as root, with every capability, and
// may gain privileges through setuid programs. User, Group, Capabilities
// and NoNewPrivs take those away.
type Process struct {
	Name    string   `json:"name"`              // unique within the namespace; names its log file
	Command []string `json:"command"`           // argv, placeholders expanded
	Restart string   `json:"restart,omitempty"` // RestartAlways, RestartOnFailure (default) or RestartNever
	User    string   `json:"user,omitempty"`    // user name or numeric UID; "": root
	Group   string   `json:"group,omitempty"`   // group name or numeric GID; "": the user's primary group
	// Capabilities, if not nil, are the only capabilities the process
	// keeps (as ambient capabilities, so they survive the exec even for a
	// non-root user); every other one is dropped from its bounding set.
	// Names are canonical: "CAP_NET_ADMIN". An empty, non-nil list drops
	// them all.
	Capabilities []string `json:"capabilities"`
	NoNewPrivs   bool     `json:"no_new_privs,omitempty"` // prctl(PR_SET_NO_NEW_PRIVS): no privilege gained by exec
	LogMax       int64    `json:"log_max,omitempty"`      // rotate the log past this many bytes; 0: DefaultLogMax
	LogKeep      int      `json:"log_keep,omitempty"`     // rotated logs kept (NAME.log.1 ...); 0: DefaultLogKeep
	// Config, if set, is the process's own configuration file: written
	// by the supervisor before each start, and named in Command by
	// ConfigPlaceholder. Expanded per namespace (see expandConfig).
	Config string `json:"config,omitempty"`
}

// ConfigPlaceholder stands in a Command for the path of the process's
// Config file, which only the supervisor knows.
const ConfigPlaceholder = "{config}"

// MaxConfig is the largest Config, expanded: a namespace's spec must stay
// a small value in the cluster's store.
const MaxConfig = 32 << 10

// Defaults of a Process's log rotation.
const (
	DefaultLogMax  = 10 << 20
	DefaultLogKeep = 3
)

// Origin says where a namespace was declared.
type Origin struct {
	File     string `json:"file"`
	Line     int    `json:"line"`
	Template string `json:"template"`
	Index    int    `json:"index"`
}

func (o Origin) String() string {
	return fmt.Sprintf("%s:%d: template %q index %d", o.File, o.Line, o.Template, o.Index)
}

// Sysctl is one per-namespace sysctl: Key in dotted form (net.ipv4.ip_forward).
type Sysctl struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Veth is a pair whose Host end lives in nsfleet's own namespace and whose Peer
// end is created directly inside the namespace.
type Veth struct {
	Host      string         `json:"host"`
	Peer      string         `json:"peer"`
	MTU       int            `json:"mtu,omitempty"` // 0: the kernel's default
	Up        bool           `json:"up,omitempty"`
	HostAddrs []netip.Prefix `json:"host_addresses,omitempty"`
	PeerAddrs []netip.Prefix `json:"peer_addresses,omitempty"`
	// HostIPv6Off (host_ipv6: false): IPv6 off on the host end (its
	// disable_ipv6), set before it goes up. A host end that goes up with
	// IPv6 adds routes of its own to the host's IPv6 table, and with
	// thousands of them every route lookup and interface change walks
	// them all.
	HostIPv6Off bool `json:"host_ipv6_off,omitempty"`
}

// Route is a route inside the namespace. A zero To means the default route.
type Route struct {
	To  netip.Prefix `json:"to"`
	Via netip.Addr   `json:"via,omitzero"`
	Dev string       `json:"dev,omitempty"` // optional; when empty the kernel picks the device from Via
}

// Lookup returns the namespace called name.
func (f *Fleet) Lookup(name string) (*Namespace, bool) {
	i, ok := f.byName[name]
	if !ok {
		return nil, false
	}
	return &f.Namespaces[i], true
}

// Has reports whether f has a namespace called name.
func (f *Fleet) Has(name string) bool {
	_, ok := f.byName[name]
	return ok
}

// Names returns the namespace names in declaration order.
func (f *Fleet) Names() []string {
	out := make([]string, len(f.Namespaces))
	for i := range f.Namespaces {
		out[i] = f.Namespaces[i].Name
	}
	return out
}

// Error is a problem in a spec file, with the line it is on.
type Error struct {
	File string
	Line int
	Msg  string
}

func (e *Error) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// ErrInvalid is matched by errors.Is for every spec error.
var ErrInvalid = errors.New("invalid spec")

func (e *Error) Is(target error) bool { return target == ErrInvalid }

// Load reads and parses the spec file at path.
func Load(path string, opts Options) (*Fleet, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	return Parse(path, data, opts)
}

// file mirrors the YAML document. Unknown keys are refused.
type file struct {
	Namespaces []template     `yaml:"namespaces"`
	Links      []linkTemplate `yaml:"links"`
}

type template struct {
	Name      string            `yaml:"name"`
	Count     *int              `yaml:"count"`
	Start     *int              `yaml:"start"`
	Loopback  string            `yaml:"loopback"`
	LoAddrs   []string          `yaml:"loopback_addresses"`
	Sysctls   map[string]string `yaml:"sysctls"`
	Veths     []vethTemplate    `yaml:"veths"`
	Bridges   []bridgeTemplate  `yaml:"bridges"`
	Routes    []routeTemplate   `yaml:"routes"`
	Processes []processTemplate `yaml:"processes"`
}

type processTemplate struct {
	Name         string    `yaml:"name"`
	Command      []string  `yaml:"command"`
	Restart      string    `yaml:"restart"`
	User         string    `yaml:"user"`
	Group        string    `yaml:"group"`
	Capabilities *[]string `yaml:"capabilities"`
	NoNewPrivs   bool      `yaml:"no_new_privs"`
	LogMax       string    `yaml:"log_max"`
	LogKeep      *int      `yaml:"log_keep"`
	Config       string    `yaml:"config"`
}

type vethTemplate struct {
	Host          string   `yaml:"host"`
	Peer          string   `yaml:"peer"`
	MTU           int      `yaml:"mtu"`
	Up            bool     `yaml:"up"`
	HostAddresses []string `yaml:"host_addresses"`
	PeerAddresses []string `yaml:"peer_addresses"`
	HostIPv6      *bool    `yaml:"host_ipv6"`
}

type routeTemplate struct {
	To  string `yaml:"to"`
	Via string `yaml:"via"`
	Dev string `yaml:"dev"`
}

// lines holds the source line of each template and of each of its veths/routes.
type lines struct {
	empty    int // line of the first empty entry of the list; 0: none
	template []int
	veth     [][]int
	route    [][]int
	link     []int // line of each links: template
}

// Parse parses and validates a spec, then expands it.
func Parse(path string, data []byte, opts Options) (*Fleet, error) {
	if items, ok := splitItems(data); ok {
		return parseItems(path, data, items, opts)
	}
	return parseWhole(path, data, opts)
}

// parseWhole parses the spec as one document (see stream.go for when).
func parseWhole(path string, data []byte, opts Options) (*Fleet, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, yamlError(path, err)
	}
	if doc.Kind == 0 {
		return nil, &Error{File: path, Msg: "empty spec: want a top-level 'namespaces:' list"}
	}
	var f file
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, yamlError(path, err)
	}
	if len(f.Namespaces) == 0 {
		return nil, &Error{File: path, Line: 1, Msg: "no namespaces declared: want a top-level 'namespaces:' list"}
	}
	ln := findLines(&doc, len(f.Namespaces))
	if l := mappingValue(rootOf(&doc), "links"); l != nil {
		for _, c := range l.Content {
			if emptyEntry(c) {
				return nil, &Error{File: path, Line: c.Line, Msg: errEmptyLink}
			}
			ln.link = append(ln.link, c.Line)
		}
	}
	if ln.empty > 0 {
		return nil, &Error{File: path, Line: ln.empty, Msg: errEmptyEntry}
	}
	return expandAll(path, f, ln, opts)
}

// expandAll validates every template, then produces the namespaces, checking
// names produced by different templates against each other.
func expandAll(path string, f file, ln lines, opts Options) (*Fleet, error) {
	limit := maxNamespaces(opts)
	total := 0
	for ti := range f.Namespaces {
		count, err := checkTemplate(path, &f.Namespaces[ti], ln.template[ti])
		if err != nil {
			return nil, err
		}
		total += count
	}
	if total > limit {
		return nil, tooMany(path, ln.template[0], total, limit)
	}
	perTemplate := make([][]Namespace, len(f.Namespaces))
	for ti := range f.Namespaces {
		nss, err := expandTemplate(path, &f.Namespaces[ti], ln.template[ti], ln.veth[ti], ln.route[ti], len(f.Links) > 0)
		if err != nil {
			return nil, err
		}
		perTemplate[ti] = nss
	}
	links := make([][]Link, len(f.Links))
	for li := range f.Links {
		ls, err := expandLinks(path, &f.Links[li], lineAt(ln.link, li, 1))
		if err != nil {
			return nil, err
		}
		links[li] = ls
	}
	return assemble(path, perTemplate, total, links)
}

func maxNamespaces(opts Options) int {
	if opts.MaxNamespaces <= 0 || opts.MaxNamespaces > MaxCount {
		return MaxCount
	}
	return opts.MaxNamespaces
}

func tooMany(path string, line, total, limit int) error {
	return &Error{File: path, Line: line, Msg: fmt.Sprintf(
		"the spec declares %d namespaces, above the limit of %d (user.max_net_namespaces)", total, limit)}
}

// checkTemplate validates what a template says of itself and returns how
// many namespaces it declares.
func checkTemplate(path string, t *template, line int) (int, error) {
	bad := func(format string, a ...any) error {
		return &Error{File: path, Line: line, Msg: fmt.Sprintf("template %q: ", t.Name) + fmt.Sprintf(format, a...)}
	}
	if t.Name == "" {
		return 0, bad("missing 'name'")
	}
	count := 1
	if t.Count != nil {
		count = *t.Count
	}
	if count < 0 {
		return 0, bad("count %d is negative", count)
	}
	if count > MaxCount {
		return 0, bad("count %d is above nsfleet's limit of %d", count, MaxCount)
	}
	if count > 1 && !strings.Contains(t.Name, "{i") {
		return 0, bad("count is %d but the name has no {i} placeholder, so every namespace would be called the same", count)
	}
	if t.Start != nil && *t.Start < 0 {
		return 0, bad("start %d is negative", *t.Start)
	}
	switch t.Loopback {
	case "", "up", "down":
	default:
		return 0, bad("loopback %q: want up or down", t.Loopback)
	}
	return count, nil
}

// expandTemplate produces a checked template's namespaces.
// withLinks: the spec has links, so a route's dev may name a link end;
// it is checked once the links are attached (checkDevices).
func expandTemplate(path string, t *template, line int, vethLines, routeLines []int, withLinks bool) ([]Namespace, error) {
	count := 1
	if t.Count != nil {
		count = *t.Count
	}
	start := 1
	if t.Start != nil {
		start = *t.Start
	}
	out := make([]Namespace, 0, count)
	for k := 0; k < count; k++ {
		ns, err := expandOne(path, *t, start+k, line, vethLines, routeLines, withLinks)
		if err != nil {
			return nil, err
		}
		out = append(out, ns)
	}
	return out, nil
}

// assemble makes the fleet of every template's namespaces, in order,
// refusing a name or a host interface produced twice, then attaches the
// links and checks what names an interface.
func assemble(path string, perTemplate [][]Namespace, total int, links [][]Link) (*Fleet, error) {
	fl := &Fleet{Source: path, Namespaces: make([]Namespace, 0, total), byName: make(map[string]int, total)}
	hostOwner := make(map[string]Origin, total)
	for _, nss := range perTemplate {
		for _, ns := range nss {
			if prev, dup := fl.byName[ns.Name]; dup {
				return nil, &Error{File: path, Line: ns.Origin.Line, Msg: fmt.Sprintf(
					"template %q index %d: namespace %q is also produced by %s",
					ns.Origin.Template, ns.Origin.Index, ns.Name, fl.Namespaces[prev].Origin)}
			}
			for _, v := range ns.Veths {
				if prev, dup := hostOwner[v.Host]; dup {
					return nil, &Error{File: path, Line: ns.Origin.Line, Msg: fmt.Sprintf(
						"template %q index %d: host interface %q is also produced by %s",
						ns.Origin.Template, ns.Origin.Index, v.Host, prev)}
				}
				hostOwner[v.Host] = ns.Origin
			}
			fl.byName[ns.Name] = len(fl.Namespaces)
			fl.Namespaces = append(fl.Namespaces, ns)
		}
	}
	if err := fl.attachLinks(path, links); err != nil {
		return nil, err
	}
	withLinks := len(fl.Links) > 0
	for i := range fl.Namespaces {
		ns := &fl.Namespaces[i]
		if withLinks || len(ns.Bridges) > 0 {
			if err := ns.checkDevices(path); err != nil {
				return nil, err
			}
		}
	}
	return fl, nil
}

func expandOne(path string, t template, idx, line int, vethLines, routeLines []int, withLinks bool) (Namespace, error) {
	x := &expander{path: path, t: t, idx: idx, line: line, withLinks: withLinks}
	name, err := expand(t.Name, expandEnv{i: idx})
	if err != nil {
		return Namespace{}, x.bad(line, "name: %v", err)
	}
	if err := ValidNamespaceName(name); err != nil {
		return Namespace{}, x.bad(line, "%v", err)
	}
	x.env = expandEnv{i: idx, name: name, hasName: true}
	ns := Namespace{
		Name:     name,
		Origin:   Origin{File: path, Line: line, Template: t.Name, Index: idx},
		Loopback: t.Loopback != "down",
	}
	if ns.Sysctls, err = x.sysctls(); err != nil {
		return Namespace{}, err
	}
	if ns.LoopbackAddrs, err = expandPrefixes(t.LoAddrs, x.env); err != nil {
		return Namespace{}, x.bad(line, "loopback_addresses: %v", err)
	}
	var ifaces map[string]bool
	if ns.Veths, ifaces, err = x.veths(vethLines); err != nil {
		return Namespace{}, err
	}
	if ns.Bridges, err = x.bridges(ifaces); err != nil {
		return Namespace{}, err
	}
	if ns.Routes, err = x.routes(routeLines, ifaces); err != nil {
		return Namespace{}, err
	}
	if len(ns.LoopbackAddrs) > 0 && len(t.Processes) > 0 { // only processes name it
		x.env.loopback = ns.LoopbackAddrs[0].Addr().String()
	}
	if ns.Processes, err = x.processes(); err != nil {
		return Namespace{}, err
	}
	return ns, nil
}

// Subset returns the fleet of the named namespaces that f has, in f's
// order; names f does not have are ignored. The namespaces are shared.
func (f *Fleet) Subset(names []string) *Fleet {
	want := make(map[string]bool, len(names))
	for _, n := range names {
		want[n] = true
	}
	out := &Fleet{Source: f.Source, byName: map[string]int{}}
	for i := range f.Namespaces {
		if want[f.Namespaces[i].Name] {
			out.byName[f.Namespaces[i].Name] = len(out.Namespaces)
			out.Namespaces = append(out.Namespaces, f.Namespaces[i])
		}
	}
	out.Links = linksOf(out.Namespaces)
	return out
}

// linksOf lists the links of nss, each once: a link is listed by its A
// end's namespace, or by its B end's when A's is not among nss.
func linksOf(nss []Namespace) []Link {
	if !slices.ContainsFunc(nss, func(n Namespace) bool { return len(n.Links) > 0 }) {
		return nil // the usual fleet, and the agent's hot path: no map
	}
	var out []Link
	in := map[string]bool{}
	for i := range nss {
		in[nss[i].Name] = true
	}
	for i := range nss {
		for _, l := range nss[i].Links {
			if l.A.Namespace == nss[i].Name || !in[l.A.Namespace] {
				out = append(out, l)
			}
		}
	}
	return out
}

// FleetOf makes a fleet of namespaces already expanded (as a cluster stores
// them), refusing a name or host interface given twice.
func FleetOf(source string, nss []Namespace) (*Fleet, error) {
	f, err := assemble(source, [][]Namespace{nss}, len(nss), nil)
	if err != nil {
		return nil, err
	}
	f.Links = linksOf(f.Namespaces)
	return f, nil
}

// HasProcesses reports whether any namespace runs processes.
func (f *Fleet) HasProcesses() bool {
	for i := range f.Namespaces {
		if len(f.Namespaces[i].Processes) > 0 {
			return true
		}
	}
	return false
}

// Same reports whether two namespaces ask the kernel for the same thing:
// every field but Origin (a line added above a template moves its
// namespaces' origins without changing them).
func (n *Namespace) Same(o *Namespace) bool {
	if n == o || n == nil || o == nil {
		return n == o // the same namespace of the same parsed fleet: no walk
	}
	a, b := *n, *o
	a.Origin, b.Origin = Origin{}, Origin{}
	if !sameLinks(a.Links, b.Links) {
		return false
	}
	a.Links, b.Links = nil, nil
	return reflect.DeepEqual(a, b)
}
