// Command nsfleet-cluster is nsfleet's cluster binary: `nsfleet agent`,
// `nsfleet cluster` and `nsfleet sim` run it. It is separate so that etcd
// stays out of every other command's start-up.
package main

import (
	"context"
	"os"

	"github.com/nsfleet/nsfleet/internal/clustercli"
	"github.com/nsfleet/nsfleet/internal/reexec"
)

func main() {
	reexec.Dispatch() // nsfleet's helpers (package reexec)
	os.Exit(clustercli.Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
