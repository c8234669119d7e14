// Package version says which nsfleet this is, from the build information
// Go records in every binary (module version, VCS revision and time, Go
// version, build settings), with -ldflags -X only for what a build outside
// git lacks. Every place that records a version (nsfleet version, the
// lab's runs, an agent's node key) records String(), so that they can be
// compared.
package version

import (
	"debug/elf"
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
)

// Release is the release name, for builds without VCS information (set
// with -ldflags "-X github.com/nsfleet/nsfleet/internal/version.Release=v1.2.3");
// "" takes the module version, or "devel".
var Release = ""

// Info is what a binary knows of its build.
type Info struct {
	Version string `json:"version"`
	Commit  string `json:"commit,omitempty"`
	Dirty   bool   `json:"dirty,omitempty"`
	Date    string `json:"date,omitempty"` // of the commit
	Go      string `json:"go"`
	OS      string `json:"os"`
	Arch    string `json:"arch"`
	// Linking is "static" (no dynamic loader: exec costs what the
	// smallest C wrapper costs) or "dynamic".
	Linking string `json:"linking"`
}

// Get reads the build information of the running binary.
func Get() Info {
	i := Info{Version: Release, Go: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH, Linking: linking()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Commit = s.Value
			case "vcs.time":
				i.Date = s.Value
			case "vcs.modified":
				i.Dirty = s.Value == "true"
			}
		}
	}
	if i.Version == "" {
		i.Version = "devel"
	}
	return i
}

// String is the one-line form every record uses:
// "devel 1a2b3c4d5e6f+dirty (2026-12-01T13:33:00Z, go1.26.8, static)".
func (i Info) String() string {
	var b strings.Builder
	b.WriteString(i.Version)
	if i.Commit != "" {
		b.WriteString(" " + i.Commit[:min(12, len(i.Commit))])
		if i.Dirty {
			b.WriteString("+dirty")
		}
	}
	fmt.Fprintf(&b, " (")
	if i.Date != "" {
		b.WriteString(i.Date + ", ")
	}
	fmt.Fprintf(&b, "%s, %s)", i.Go, i.Linking)
	return b.String()
}

// String is Get().String().
func String() string { return Get().String() }

// linking tells a static binary from a dynamic one by its program
// headers: a dynamic one names its loader (PT_INTERP).
func linking() string {
	self, err := os.Executable()
	if err != nil {
		return "unknown"
	}
	f, err := elf.Open(self)
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return "dynamic"
		}
	}
	return "static"
}
