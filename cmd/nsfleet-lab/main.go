// Command nsfleet-lab is nsfleet's lab binary: `nsfleet bench` runs it. It
// is separate so that the lab's plots, statistics and SQLite store stay out
// of every other command's start-up. It is also the init of the lab's VMs
// (bench --kernel), which boot with this binary inside.
package main

import (
	"context"
	"os"

	"github.com/nsfleet/nsfleet/bench/vm"
	"github.com/nsfleet/nsfleet/internal/labcli"
	"github.com/nsfleet/nsfleet/internal/reexec"
)

func main() {
	reexec.Dispatch() // nsfleet's helpers (package reexec)
	if vm.IsGuest() {
		vm.GuestMain() // init of a lab VM (bench --kernel): does not return
	}
	os.Exit(labcli.Run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
