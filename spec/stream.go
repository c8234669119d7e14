package spec

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"go.yaml.in/yaml/v3"
)

// A real gateway's fleet is one template per router: 40,000 templates, a
// 19 MB file. yaml.v3 builds a node tree of the whole document before it
// decodes any of it (about 20 nodes of some 200 bytes per router), and the
// line numbers take a second tree: 900 MB to plan 40,000 routers. So a spec
// in the plain block form, which is how people and generators write it, is
// cut into its top-level items at the text level and each item parsed on
// its own: the trees are per item and short-lived. Anything the cut cannot
// be sure of (flow style at the top, anchors and aliases that may reach
// across items, tags, several documents) goes through the whole-document
// parser, which gives the same result (FuzzParse checks both agree).

// item is one top-level entry of the namespaces list or of the links
// list, as bytes.
type item struct {
	start, end int // offsets in the file
	line       int // 1-based line of its first line
	link       bool
}

// splitItems cuts data into the items of its top-level namespaces and
// links lists, or says it cannot be sure to (ok false).
func splitItems(data []byte) (items []item, ok bool) {
	if bytes.ContainsAny(data, "&*!\t") || bytes.Contains(data, []byte("<<")) || bytes.Contains(data, []byte("\n...")) {
		return nil, false
	}
	// section: the list being read ("" before the first key); each key once.
	section, seen, indent, line := "", map[string]bool{}, -1, 0
	namespaces := 0
	for off := 0; off < len(data); {
		end := bytes.IndexByte(data[off:], '\n')
		next := len(data)
		if end >= 0 {
			next = off + end + 1
		} else {
			end = len(data) - off
		}
		l := data[off : off+end]
		line++
		trimmed := bytes.TrimLeft(l, " ")
		ind := len(l) - len(trimmed)
		blank := len(bytes.TrimSpace(trimmed)) == 0 || trimmed[0] == '#'
		switch {
		case blank:
		case section == "" && line == 1 && bytes.Equal(bytes.TrimRight(l, " \r"), []byte("---")):
			// a document start
		case ind == 0 && !isItemStart(trimmed) && (section == "" || indent >= 0):
			// Only a key, at the top, with nothing after it but a
			// comment, after a list that had items.
			key := ""
			for _, k := range []string{"namespaces", "links"} {
				if rest, found := bytes.CutPrefix(l, []byte(k+":")); found {
					// A comment needs a space before its '#'.
					if t := bytes.TrimSpace(rest); len(t) == 0 || t[0] == '#' && rest[0] == ' ' {
						key = k
					}
				}
			}
			if key == "" || seen[key] {
				return nil, false
			}
			if len(items) > 0 {
				items[len(items)-1].end = off
			}
			section, seen[key], indent = key, true, -1
		case section == "":
			return nil, false
		case indent < 0:
			if !isItemStart(trimmed) {
				return nil, false
			}
			indent = ind
			items = append(items, item{start: off, line: line, link: section == "links"})
		case ind < indent, ind == indent && !isItemStart(trimmed):
			return nil, false // something after the list: let the parser say what
		case ind == indent:
			items[len(items)-1].end = off
			items = append(items, item{start: off, line: line, link: section == "links"})
		}
		if section == "namespaces" && indent >= 0 && ind == indent && isItemStart(trimmed) {
			namespaces++
		}
		off = next
	}
	if namespaces == 0 || indent < 0 {
		return nil, false
	}
	items[len(items)-1].end = len(data)
	return items, true
}

func isItemStart(trimmed []byte) bool {
	return len(trimmed) > 0 && trimmed[0] == '-' && (len(trimmed) == 1 || trimmed[1] == ' ' || trimmed[1] == '\r')
}

// parseItems parses, checks and expands each item on its own, in
// parallel (items are independent), then assembles the fleet. Each item's
// template and node tree are garbage as soon as it is expanded. The first
// error in file order is returned.
func parseItems(path string, data []byte, items []item, opts Options) (*Fleet, error) {
	withLinks := slices.ContainsFunc(items, func(it item) bool { return it.link })
	perItem := make([][]Namespace, len(items))
	links := make([][]Link, len(items))
	counts := make([]int, len(items))
	errs := make([]error, len(items))
	var next atomic.Int64
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), max(len(items)/64, 1)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= len(items) {
					return
				}
				if items[i].link {
					links[i], errs[i] = parseLinkItem(path, data, items[i])
				} else {
					perItem[i], counts[i], errs[i] = parseItem(path, data, items[i], withLinks)
				}
			}
		}()
	}
	wg.Wait()
	total := 0
	for i, err := range errs {
		if err != nil {
			return nil, err
		}
		total += counts[i]
	}
	if limit := maxNamespaces(opts); total > limit {
		return nil, tooMany(path, items[0].line, total, limit)
	}
	return assemble(path, perItem, total, links)
}

// parseItem parses one item (one node tree, for the values and the
// lines; unknown keys are refused as the whole-document decoder's
// KnownFields does), checks its template and expands it.
func parseItem(path string, data []byte, it item, withLinks bool) ([]Namespace, int, error) {
	var t template
	doc, err := decodeItem(path, data, it, &t, errEmptyEntry)
	if err != nil {
		return nil, 0, err
	}
	one := findItemLines(doc)
	shift := func(ls []int) []int {
		for i := range ls {
			ls[i] += it.line - 1
		}
		return ls
	}
	line := one.template[0] + it.line - 1
	count, err := checkTemplate(path, &t, line)
	if err != nil {
		return nil, 0, err
	}
	nss, err := expandTemplate(path, &t, line, shift(one.veth[0]), shift(one.route[0]), withLinks)
	return nss, count, err
}

// parseLinkItem parses one item of the links list and expands it.
func parseLinkItem(path string, data []byte, it item) ([]Link, error) {
	var t linkTemplate
	doc, err := decodeItem(path, data, it, &t, errEmptyLink)
	if err != nil {
		return nil, err
	}
	return expandLinks(path, &t, rootOf(doc).Content[0].Line+it.line-1)
}

// decodeItem parses one item into v (a pointer to its template struct),
// refusing unknown keys as the whole-document decoder's KnownFields does.
func decodeItem[T any](path string, data []byte, it item, v *T, empty string) (*yaml.Node, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(data[it.start:it.end], &doc); err != nil {
		return nil, shiftLine(yamlError(path, err), it.line-1)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.SequenceNode ||
		len(doc.Content[0].Content) != 1 || emptyEntry(doc.Content[0].Content[0]) {
		return nil, &Error{File: path, Line: it.line, Msg: empty}
	}
	n := doc.Content[0].Content[0]
	if err := knownFields(n, reflect.TypeFor[T]()); err != nil {
		return nil, shiftLine(yamlError(path, err), it.line-1)
	}
	if err := n.Decode(v); err != nil {
		return nil, shiftLine(yamlError(path, err), it.line-1)
	}
	return &doc, nil
}

// knownFields refuses mapping keys that t (a struct, or a slice, map or
// pointer of one) has no yaml field for, with yaml.v3's own words.
func knownFields(n *yaml.Node, t reflect.Type) error {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Slice && n.Kind == yaml.SequenceNode:
		for _, c := range n.Content {
			if err := knownFields(c, t.Elem()); err != nil {
				return err
			}
		}
	case t.Kind() == reflect.Map && n.Kind == yaml.MappingNode:
		for i := 1; i < len(n.Content); i += 2 {
			if err := knownFields(n.Content[i], t.Elem()); err != nil {
				return err
			}
		}
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			k := n.Content[i]
			ft, ok := yamlField(t, k.Value)
			if !ok {
				return fmt.Errorf("yaml: unmarshal errors:\n  line %d: field %s not found in type %s", k.Line, k.Value, t)
			}
			if err := knownFields(n.Content[i+1], ft); err != nil {
				return err
			}
		}
	}
	return nil
}

func yamlField(t reflect.Type, key string) (reflect.Type, bool) {
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		if name == key {
			return f.Type, true
		}
	}
	return nil, false
}

// findItemLines reads the lines of a document whose root is a one-item
// sequence, as findLines does for the namespaces list.
func findItemLines(doc *yaml.Node) lines {
	root := doc
	if root.Kind == yaml.DocumentNode && len(root.Content) > 0 {
		root = root.Content[0]
	}
	wrapped := &yaml.Node{Kind: yaml.MappingNode, Content: []*yaml.Node{{Kind: yaml.ScalarNode, Value: "namespaces"}, root}}
	return findLines(wrapped, 1)
}

const (
	errEmptyEntry = "empty entry in the namespaces list: want a template (name: ...)"
	errEmptyLink  = "empty entry in the links list: want a link (a: NAMESPACE:INTERFACE, b: ...)"
)

// emptyEntry reports whether a list entry is empty (a lone "-").
func emptyEntry(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

func shiftLine(err error, by int) error {
	var e *Error
	if errors.As(err, &e) && e.Line > 0 {
		e.Line += by
	}
	return err
}
