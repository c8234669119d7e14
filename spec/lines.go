package spec

// Line numbers for errors: where in the YAML each template and its items are.

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

func yamlError(path string, err error) error {
	// yaml.v3 messages look like "yaml: line 7: ..." or, for type errors,
	// "yaml: unmarshal errors:\n  line 7: ...". Keep the line, drop the noise.
	msg := err.Error()
	msg = strings.TrimPrefix(msg, "yaml: ")
	msg = strings.TrimPrefix(msg, "unmarshal errors:\n")
	var parts []string
	line := 0
	for _, p := range strings.Split(msg, "\n") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		var n int
		if _, err := fmt.Sscanf(p, "line %d:", &n); err == nil {
			if line == 0 {
				line = n
			}
			if len(parts) == 0 {
				p = strings.TrimSpace(p[strings.IndexByte(p, ':')+1:])
			}
		}
		parts = append(parts, p)
	}
	return &Error{File: path, Line: line, Msg: strings.Join(parts, "; ")}
}

func rootOf(doc *yaml.Node) *yaml.Node {
	if doc.Kind == yaml.DocumentNode && len(doc.Content) > 0 {
		return doc.Content[0]
	}
	return doc
}

func findLines(doc *yaml.Node, n int) lines {
	ln := lines{template: make([]int, n), veth: make([][]int, n), route: make([][]int, n)}
	seq := mappingValue(rootOf(doc), "namespaces")
	if seq == nil || seq.Kind != yaml.SequenceNode {
		return ln
	}
	for i, item := range seq.Content {
		if emptyEntry(item) && ln.empty == 0 {
			ln.empty = item.Line
		}
		if i >= n {
			break
		}
		ln.template[i] = item.Line
		if v := mappingValue(item, "veths"); v != nil {
			for _, c := range v.Content {
				ln.veth[i] = append(ln.veth[i], c.Line)
			}
		}
		if r := mappingValue(item, "routes"); r != nil {
			for _, c := range r.Content {
				ln.route[i] = append(ln.route[i], c.Line)
			}
		}
	}
	return ln
}

func mappingValue(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func lineAt(ls []int, i, fallback int) int {
	if i < len(ls) && ls[i] > 0 {
		return ls[i]
	}
	return fallback
}
