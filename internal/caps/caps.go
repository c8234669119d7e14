// Package caps tells whether this process may change namespaces, so
// that commands refuse once and clearly before touching anything.
package caps

import (
	"fmt"
	"strings"

	"golang.org/x/sys/unix"
)

// The capabilities nsfleet needs to change namespaces: CAP_SYS_ADMIN for
// setns, unshare and mounts, CAP_NET_ADMIN for links and sysctls.
var neededCaps = []struct {
	n    int
	name string
}{{unix.CAP_SYS_ADMIN, "CAP_SYS_ADMIN"}, {unix.CAP_NET_ADMIN, "CAP_NET_ADMIN"}}

// Missing lists the needed capabilities the process does not have in its
// effective set (root of a user namespace has them all there).
func Missing() []string {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return nil // cannot tell: let the kernel say
	}
	var out []string
	for _, c := range neededCaps {
		if data[c.n/32].Effective&(1<<(c.n%32)) == 0 {
			out = append(out, c.name)
		}
	}
	return out
}

// Need returns an error naming command and what it lacks, or nil.
func Need(command string) error {
	missing := Missing()
	if len(missing) == 0 {
		return nil
	}
	return fmt.Errorf("%s: needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN; this process lacks %s): run it with sudo, or as root", command, strings.Join(missing, ", "))
}
