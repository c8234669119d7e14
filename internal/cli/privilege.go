package cli

import (
	"github.com/nsfleet/nsfleet/internal/caps"
	"github.com/nsfleet/nsfleet/internal/exitcode"
)

// missingCaps lists the capabilities for changing namespaces that the
// process lacks.
func missingCaps() []string { return caps.Missing() }

// needRoot refuses a command that changes namespaces when the process lacks
// the capabilities for it, once and clearly, before anything is touched.
func needRoot(command string) error {
	if err := caps.Need(command); err != nil {
		return &exitError{Code: exitcode.Failed, Err: err}
	}
	return nil
}
