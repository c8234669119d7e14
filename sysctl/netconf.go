package sysctl

import (
	"strings"

	"golang.org/x/sys/unix"
)

// NetconfField is where rtnetlink's netconf messages (RTM_GETNETCONF)
// report a sysctl's value: the address family, the configuration (all,
// default, or a device's index) and the attribute.
type NetconfField struct {
	Family int    // unix.AF_INET or unix.AF_INET6
	Index  int32  // NetconfAll or NetconfDefault
	Attr   uint16 // NetconfForwarding, ...
}

// Netconf attributes (linux/netconf.h).
const (
	NetconfIfindex                  uint16 = 1
	NetconfForwarding               uint16 = 2
	NetconfRPFilter                 uint16 = 3
	NetconfProxyNeigh               uint16 = 5
	NetconfIgnoreRoutesWithLinkdown uint16 = 6
)

// The netconf "devices" that stand for net.ipv4.conf.all and .default.
const (
	NetconfAll     int32 = -1 // NETCONFA_IFINDEX_ALL
	NetconfDefault int32 = -2 // NETCONFA_IFINDEX_DEFAULT
)

// Netconf reports whether key can be read over rtnetlink, and where: one
// request on a socket already open in the namespace instead of a path walk
// through procfs, whose sysctl directory entries of every namespace seen
// share one hash chain (see the package doc). Only keys whose netconf
// attribute holds the very value procfs shows are listed; they cannot be
// written this way.
func Netconf(key string) (NetconfField, bool) {
	if key == "net.ipv4.ip_forward" { // an alias of conf.all.forwarding
		return NetconfField{unix.AF_INET, NetconfAll, NetconfForwarding}, true
	}
	var f NetconfField
	var rest string
	if r, ok := strings.CutPrefix(key, "net.ipv4.conf."); ok {
		f.Family, rest = unix.AF_INET, r
	} else if r, ok := strings.CutPrefix(key, "net.ipv6.conf."); ok {
		f.Family, rest = unix.AF_INET6, r
	} else {
		return f, false
	}
	conf, leaf, _ := strings.Cut(rest, ".")
	switch conf {
	case "all":
		f.Index = NetconfAll
	case "default":
		f.Index = NetconfDefault
	default:
		return f, false
	}
	switch {
	case leaf == "forwarding":
		f.Attr = NetconfForwarding
	case leaf == "ignore_routes_with_linkdown":
		f.Attr = NetconfIgnoreRoutesWithLinkdown
	case leaf == "rp_filter" && f.Family == unix.AF_INET:
		f.Attr = NetconfRPFilter
	case leaf == "proxy_arp" && f.Family == unix.AF_INET:
		f.Attr = NetconfProxyNeigh
	case leaf == "proxy_ndp" && f.Family == unix.AF_INET6:
		f.Attr = NetconfProxyNeigh
	default:
		return f, false
	}
	return f, true
}
