// Package reexec is the one registry of nsfleet's helper entry points:
// code that runs when a binary re-executes itself (/proc/self/exe) with a
// helper's name as its first argument, such as the mount-namespace helper
// of `exec --mount-ns` or the privileges helper of supervised processes.
//
// A package that owns a helper registers it from an init function; every
// main and every test main calls Dispatch first. A new binary, or a test
// binary that runs commands in process, thereby serves every helper of the
// packages it links, and none can be forgotten.
package reexec

import (
	"fmt"
	"os"
	"strings"
)

// Prefix starts every helper's name, so that a helper name never collides
// with a command line a user types.
const Prefix = "__nsfleet-"

var helpers = map[string]func(args []string){}

// Register makes name (which must start with Prefix) run main, which
// gets the arguments after the name and must not return. It panics on a
// bad or repeated name: a programming error found at start-up.
func Register(name string, main func(args []string)) {
	if !strings.HasPrefix(name, Prefix) {
		panic(fmt.Sprintf("reexec: helper %q must start with %q", name, Prefix))
	}
	if _, dup := helpers[name]; dup {
		panic(fmt.Sprintf("reexec: helper %q registered twice", name))
	}
	helpers[name] = main
}

// Dispatch runs the helper that os.Args names, if any; it then exits and
// does not return. Otherwise it returns at once.
func Dispatch() {
	if len(os.Args) < 2 {
		return
	}
	if main, ok := helpers[os.Args[1]]; ok {
		main(os.Args[2:])
		os.Exit(0) // a helper that returns has nothing more to do
	}
}
