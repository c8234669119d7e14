// Command nsfleet declares, creates, repairs and tears down fleets of Linux
// network namespaces. See `nsfleet --help`.
package main

import (
	"context"
	"os"

	"github.com/nsfleet/nsfleet/internal/cli"
	"github.com/nsfleet/nsfleet/internal/reexec"
)

func main() {
	reexec.Dispatch() // nsfleet's helpers (package reexec)
	os.Exit(cli.Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
