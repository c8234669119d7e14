package rtnl

import (
	"context"
	"errors"

	"github.com/nsfleet/nsfleet/internal/pool"
	"golang.org/x/sys/unix"
)

// rtnlgrpNsid is the multicast group of namespace id announcements
// (RTNLGRP_NSID).
const rtnlgrpNsid = 28

// WatchNsIDs calls fn whenever the calling thread's namespace announces
// that one of its namespace ids was added or removed (RTM_NEWNSID,
// RTM_DELNSID), until ctx ends. Freeing a namespace starts by removing
// its id from every namespace that had one (unhash_nsid in cleanup_net):
// on the host of a fleet that is one announcement per namespace, the sign
// that the kernel is working on them long before their devices go (a
// batch of thousands is unhashed one by one, then its devices are
// unregistered together). An overrun of the socket's buffer counts as an
// announcement: it means there were many.
func WatchNsIDs(ctx context.Context, fn func()) error {
	fd, err := pool.RetryValue(func() (int, error) {
		return unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	})
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return err
	}
	if err := unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_ADD_MEMBERSHIP, rtnlgrpNsid); err != nil {
		return err
	}
	// Wake up now and then to see whether ctx ended.
	tv := unix.Timeval{Usec: 200_000}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		return err
	}
	buf := make([]byte, 16<<10)
	for ctx.Err() == nil {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		switch {
		case err == nil && n > 0, errors.Is(err, unix.ENOBUFS):
			fn()
		case err == nil, errors.Is(err, unix.EAGAIN), errors.Is(err, unix.EINTR):
		default:
			return err
		}
	}
	return nil
}
