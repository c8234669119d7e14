// Package sysctl reads and writes per-network-namespace sysctls.
//
// # Why a private procfs
//
// /proc/sys/net resolves names against the network namespace of the calling
// thread, and every namespace that ever looked a name up leaves a dentry of
// that name in the procfs superblock. Each later lookup compares against all
// of them (proc_sys_compare), so on the shared /proc a sysctl write costs
// 0.1 ms at the first namespace and about 10 ms at the 5,000th. A procfs
// instance of our own (fsopen/fsmount, never attached anywhere) has its own
// dentry cache; replacing it every RotateEvery namespaces keeps the cost flat.
//
// # Threading contract
//
// Write and Read act on the network namespace of the calling OS thread, so
// they must run inside netns.Create or netns.Do. A Procfs is not safe for
// concurrent use: give each worker its own.
package sysctl

import (
	"errors"
	"fmt"
	"strings"

	"github.com/nsfleet/nsfleet/internal/names"
	"github.com/nsfleet/nsfleet/internal/pool"
	"golang.org/x/sys/unix"
)

// RotateEvery is how many namespaces one procfs instance serves before it is
// replaced (measured: the per-lookup cost grows with the namespaces seen).
const RotateEvery = 100

// Procfs is a private procfs instance, or /proc itself when the kernel does
// not offer fsopen (before 5.2) or forbids it.
type Procfs struct {
	fd      int
	private bool
	seen    int  // namespaces this instance has looked into
	next    bool // NextNamespace was called since the last lookup
}

// Open returns a new private procfs instance, falling back to /proc.
func Open() (*Procfs, error) {
	p := &Procfs{fd: -1}
	if err := p.reopen(); err != nil {
		return nil, err
	}
	return p, nil
}

// Fd returns the procfs root descriptor, valid until the next lookup after
// NextNamespace, or Close; paths under it look like "sys/net/ipv4/ip_forward".
func (p *Procfs) Fd() int { return p.fd }

// Private reports whether the instance is private (false: shared /proc).
func (p *Procfs) Private() bool { return p.private }

func (p *Procfs) reopen() error {
	if p.fd >= 0 {
		unix.Close(p.fd)
		p.fd = -1
	}
	fd, err := pool.RetryValue(openPrivate)
	if err == nil {
		p.fd, p.private = fd, true
		return nil
	}
	fd, err2 := unix.Open("/proc", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err2 != nil {
		return fmt.Errorf("open procfs: %v; open /proc: %w", err, err2)
	}
	p.fd, p.private = fd, false
	return nil
}

func openPrivate() (int, error) {
	fsfd, err := unix.Fsopen("proc", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen proc: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("fsconfig proc: %w", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NOSUID|unix.MOUNT_ATTR_NODEV|unix.MOUNT_ATTR_NOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsmount proc: %w", err)
	}
	return mfd, nil
}

// NextNamespace tells p that following calls are for another namespace.
// Every RotateEvery namespaces that p is then asked about, the instance is
// replaced (before the first lookup in the next one, so namespaces that
// turn out to need no procfs cost nothing).
func (p *Procfs) NextNamespace() error {
	p.next = true
	return nil
}

// turn counts a namespace looked into, replacing the instance when due.
func (p *Procfs) turn() error {
	if !p.next {
		return nil
	}
	p.next = false
	p.seen++
	if p.private && p.seen%RotateEvery == 0 {
		return p.reopen()
	}
	return nil
}

// Close releases the instance.
func (p *Procfs) Close() error {
	if p == nil || p.fd < 0 {
		return nil
	}
	err := unix.Close(p.fd)
	p.fd = -1
	return err
}

// ErrUnknownKey is matched by errors.Is when a key does not exist in the
// namespace (a typo, a module not loaded, or an interface that is missing).
var ErrUnknownKey = errors.New("no such sysctl in this namespace")

func (p *Procfs) open(key string, flags int) (int, error) {
	if err := p.turn(); err != nil {
		return -1, err
	}
	path := "sys/" + names.SysctlPath(key)
	fd, err := pool.RetryValue(func() (int, error) { return unix.Openat(p.fd, path, flags|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0) })
	if errors.Is(err, unix.ENOENT) {
		return -1, fmt.Errorf("sysctl %s: %w", key, ErrUnknownKey)
	}
	if err != nil {
		return -1, fmt.Errorf("sysctl %s: open: %w", key, err)
	}
	return fd, nil
}

// Write sets key (dotted, net.ipv4.ip_forward) in the calling thread's
// namespace.
func (p *Procfs) Write(key, value string) error {
	fd, err := p.open(key, unix.O_WRONLY)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	if _, err := unix.Write(fd, []byte(value+"\n")); err != nil {
		return fmt.Errorf("sysctl %s=%s: write: %w", key, value, err)
	}
	return nil
}

// Read returns key's value in the calling thread's namespace, with tabs
// and runs of space folded to one space, as sysctl(8) prints it.
func (p *Procfs) Read(key string) (string, error) {
	fd, err := p.open(key, unix.O_RDONLY)
	if err != nil {
		return "", err
	}
	defer unix.Close(fd)
	buf := make([]byte, 4096)
	n, err := unix.Read(fd, buf)
	if err != nil {
		return "", fmt.Errorf("sysctl %s: read: %w", key, err)
	}
	return Normalize(string(buf[:n])), nil
}

// Normalize folds whitespace so that values compare as sysctl(8) shows
// them: "4096\t87380\t6291456\n" equals "4096 87380 6291456".
func Normalize(v string) string {
	return strings.Join(strings.Fields(v), " ")
}
