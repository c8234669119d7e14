package rtnl

import (
	"errors"
	"fmt"

	"github.com/nsfleet/nsfleet/internal/pool"
	"golang.org/x/sys/unix"
)

// Devices answers what a namespace's link of a given name or index is,
// by ioctl, in constant time. An rtnetlink answer about a veth carries the
// id of its peer's namespace, which the kernel finds by a scan over every
// id the asking namespace has (peernet2id): on the host of a fleet that is
// one per namespace, so asking about every host veth, by dump or one by
// one, is quadratic in the fleet. The ioctls look the device up by its
// name or index hash and fill in nothing else.
//
// Like a Conn, a Devices belongs to the namespace of the thread that
// opened it, and may then be used from any goroutine at once.
type Devices struct{ fd int }

// OpenDevices opens a Devices for the calling thread's namespace.
func OpenDevices() (*Devices, error) {
	fd, err := pool.RetryValue(func() (int, error) {
		return unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	})
	if err != nil {
		return nil, fmt.Errorf("device socket: %w", err)
	}
	return &Devices{fd: fd}, nil
}

// Close releases the socket.
func (d *Devices) Close() {
	if d != nil && d.fd >= 0 {
		unix.Close(d.fd)
		d.fd = -1
	}
}

// Index returns the ifindex of the link called name, and false if there is
// none. It is one lookup in the kernel's name hash (which has 256 buckets:
// at tens of thousands of links each lookup walks a chain of a hundred or
// more names, so callers ask only what they need).
func (d *Devices) Index(name string) (int, bool, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return 0, false, fmt.Errorf("link %q: %w", name, err)
	}
	if err := unix.IoctlIfreq(d.fd, unix.SIOCGIFINDEX, ifr); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("link %s: %w", name, err)
	}
	return int(ifr.Uint32()), true, nil
}

// ByName returns the link called name with its Index, Name, Up and MTU
// (not its Type nor its peer: see Devices), and false if there is none.
// It costs three name lookups; Index costs one.
func (d *Devices) ByName(name string) (Link, bool, error) {
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return Link{}, false, fmt.Errorf("link %q: %w", name, err)
	}
	if err := unix.IoctlIfreq(d.fd, unix.SIOCGIFINDEX, ifr); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return Link{}, false, nil
		}
		return Link{}, false, fmt.Errorf("link %s: %w", name, err)
	}
	l := Link{Name: name, Index: int(ifr.Uint32()), PeerIndex: -1, PeerNsID: -1}
	if err := unix.IoctlIfreq(d.fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return Link{}, false, nil // gone in between
		}
		return Link{}, false, fmt.Errorf("link %s: flags: %w", name, err)
	}
	l.Up = ifr.Uint16()&unix.IFF_UP != 0
	if err := unix.IoctlIfreq(d.fd, unix.SIOCGIFMTU, ifr); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return Link{}, false, nil
		}
		return Link{}, false, fmt.Errorf("link %s: mtu: %w", name, err)
	}
	l.MTU = int(ifr.Uint32())
	return l, true, nil
}

// NameOf returns the name of the link with ifindex index, and false if
// there is none.
func (d *Devices) NameOf(index int) (string, bool, error) {
	ifr, err := unix.NewIfreq("")
	if err != nil {
		return "", false, err
	}
	ifr.SetUint32(uint32(index))
	if err := unix.IoctlIfreq(d.fd, unix.SIOCGIFNAME, ifr); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return "", false, nil
		}
		return "", false, fmt.Errorf("link %d: %w", index, err)
	}
	return ifr.Name(), true, nil
}
