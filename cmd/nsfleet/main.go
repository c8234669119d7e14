// Command nsfleet declares, creates, repairs and tears down fleets of Linux
// network namespaces. See `nsfleet --help`.
package main

import (
	"context"
	"os"

	"github.com/nsfleet/nsfleet/bench/vm"
	"github.com/nsfleet/nsfleet/internal/cli"
	"github.com/nsfleet/nsfleet/internal/reexec"
)

func main() {
	reexec.Dispatch() // nsfleet's helpers (package reexec)
	if vm.IsGuest() {
		vm.GuestMain() // init of a lab VM (nsfleet bench --kernel): does not return
	}
	os.Exit(cli.Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
