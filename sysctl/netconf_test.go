package sysctl_test

import (
	"testing"

	"github.com/nsfleet/nsfleet/sysctl"
	"golang.org/x/sys/unix"
)

func TestNetconfKeys(t *testing.T) {
	for key, want := range map[string]sysctl.NetconfField{
		"net.ipv4.ip_forward":                           {Family: unix.AF_INET, Index: sysctl.NetconfAll, Attr: sysctl.NetconfForwarding},
		"net.ipv4.conf.all.forwarding":                  {Family: unix.AF_INET, Index: sysctl.NetconfAll, Attr: sysctl.NetconfForwarding},
		"net.ipv4.conf.default.rp_filter":               {Family: unix.AF_INET, Index: sysctl.NetconfDefault, Attr: sysctl.NetconfRPFilter},
		"net.ipv4.conf.all.proxy_arp":                   {Family: unix.AF_INET, Index: sysctl.NetconfAll, Attr: sysctl.NetconfProxyNeigh},
		"net.ipv6.conf.all.forwarding":                  {Family: unix.AF_INET6, Index: sysctl.NetconfAll, Attr: sysctl.NetconfForwarding},
		"net.ipv6.conf.default.proxy_ndp":               {Family: unix.AF_INET6, Index: sysctl.NetconfDefault, Attr: sysctl.NetconfProxyNeigh},
		"net.ipv6.conf.all.ignore_routes_with_linkdown": {Family: unix.AF_INET6, Index: sysctl.NetconfAll, Attr: sysctl.NetconfIgnoreRoutesWithLinkdown},
	} {
		if got, ok := sysctl.Netconf(key); !ok || got != want {
			t.Errorf("Netconf(%s) = %+v, %v; want %+v", key, got, ok, want)
		}
	}
	for _, key := range []string{
		"net.ipv4.tcp_syncookies",       // not a netconf value
		"net.ipv4.conf.eth0.forwarding", // a device's: needs its index
		"net.ipv6.conf.all.rp_filter",   // no such IPv6 key
		"net.ipv4.conf.all.proxy_ndp",
		"net.ipv4.conf.all",
		"net.ipv4.conf.",
		"net.ipv6.conf.all.forwarding.x",
	} {
		if f, ok := sysctl.Netconf(key); ok {
			t.Errorf("Netconf(%s) = %+v, want none", key, f)
		}
	}
}
