// Package names holds nsfleet's rules for the names it gives the kernel:
// namespace (pin) names, interface names and sysctl paths. Every other
// package, and the C fast path of exec (tested against this one), takes
// its rules from here.
package names

import (
	"fmt"
	"strings"
)

// IFNAMSIZ is the kernel's interface name buffer: 15 bytes and a NUL.
const IFNAMSIZ = 16

// Namespace applies iproute2's rules for `ip netns add NAME` (a file name
// under the run dir): not empty, not "." or "..", no '/', at most 255
// bytes. NUL and newline are refused too: no tool can show them.
func Namespace(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("namespace name is empty")
	case name == "." || name == "..":
		return fmt.Errorf("namespace name %q is not allowed", name)
	case strings.ContainsAny(name, "/\x00\n"):
		return fmt.Errorf("namespace name %q contains '/', NUL or newline", name)
	case len(name) > 255:
		return fmt.Errorf("namespace name %.20q... is %d bytes, above 255", name, len(name))
	}
	return nil
}

// Interface applies the kernel's dev_valid_name: 1 to 15 bytes, not "." or
// "..", no '/', ':' or whitespace.
func Interface(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("interface name is empty")
	case len(name) >= IFNAMSIZ:
		return fmt.Errorf("interface name %q is %d bytes, above the kernel's 15", name, len(name))
	case name == "." || name == "..":
		return fmt.Errorf("interface name %q is not allowed", name)
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; c {
		case '/', ':', 0, ' ', '\t', '\n', '\v', '\f', '\r':
			return fmt.Errorf("interface name %q contains %q, which the kernel refuses", name, c)
		}
	}
	return nil
}

// SysctlPath turns a dotted key into its path under /proc/sys. As sysctl(8)
// does, a '/' inside a dotted key stands for a '.' in an interface name
// (net.ipv4.conf.eth0/100.forwarding -> net/ipv4/conf/eth0.100/forwarding).
func SysctlPath(key string) string {
	parts := strings.Split(key, ".")
	for i, p := range parts {
		parts[i] = strings.ReplaceAll(p, "/", ".")
	}
	return strings.Join(parts, "/")
}
