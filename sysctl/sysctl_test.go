package sysctl_test

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/nsfleet/nsfleet/internal/nstest"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/sysctl"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { nstest.Main(m) }

func TestWriteReadInNamespace(t *testing.T) {
	nstest.RequireRoot(t)
	p, err := sysctl.Open()
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if !p.Private() {
		t.Log("kernel without fsopen: using the shared /proc")
	}
	hostBefore, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if err != nil {
		t.Fatal(err)
	}
	h, err := netns.Create(func(*netns.NS) error {
		for i := 0; i < sysctl.RotateEvery+1; i++ {
			if err := p.NextNamespace(); err != nil { // forces a rotation
				return err
			}
		}
		if err := p.Write("net.ipv4.ip_forward", "1"); err != nil {
			return err
		}
		if v, err := p.Read("net.ipv4.ip_forward"); err != nil || v != "1" {
			return fmt.Errorf("read back %q, %v", v, err)
		}
		if v, err := p.Read("net.ipv4.tcp_rmem"); err != nil || len(v) == 0 {
			return fmt.Errorf("tcp_rmem %q, %v", v, err)
		}
		if _, err := p.Read("net.ipv4.no_such_key"); !errors.Is(err, sysctl.ErrUnknownKey) {
			return fmt.Errorf("unknown key: %v", err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	h.Close()
	hostAfter, _ := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
	if string(hostAfter) != string(hostBefore) {
		t.Fatalf("the host's ip_forward changed: %q -> %q", hostBefore, hostAfter)
	}
}

func TestNormalize(t *testing.T) {
	if got := sysctl.Normalize("4096\t131072  6291456\n"); got != "4096 131072 6291456" {
		t.Fatal(got)
	}
}

// BenchmarkLookupTrap measures one sysctl write in a new namespace after K
// other namespaces have looked the same name up through the shared /proc
// (NSFLEET_BENCH_NAMESPACES, default 1000): through /proc/sys, and through
// a private procfs instance replaced every RotateEvery namespaces, as Up
// does. Namespace creation is not timed. See docs/PERFORMANCE.md.
func BenchmarkLookupTrap(b *testing.B) {
	nstest.RequireRoot(b)
	k := 1000
	if s := os.Getenv("NSFLEET_BENCH_NAMESPACES"); s != "" {
		k, _ = strconv.Atoi(s)
	}
	held := make([]*netns.NS, 0, k)
	defer func() {
		for _, h := range held {
			h.Close()
		}
	}()
	start := time.Now()
	for i := 0; i < k; i++ {
		h, err := netns.Create(func(*netns.NS) error {
			_, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward")
			return err
		})
		if err != nil {
			b.Fatal(err)
		}
		held = append(held, h)
	}
	b.Logf("%d namespaces prepared in %v", k, time.Since(start))
	// As in a fleet, each write happens in a namespace that has not
	// looked the name up before.
	write := func(b *testing.B, dirfd func() int) {
		for i := 0; i < b.N; i++ {
			b.StopTimer()
			h, err := netns.Create(nil)
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
			err = netns.Do(h, func() error {
				fd, err := unix.Openat(dirfd(), "sys/net/ipv4/ip_forward", unix.O_WRONLY|unix.O_CLOEXEC, 0)
				if err != nil {
					return err
				}
				defer unix.Close(fd)
				_, err = unix.Write(fd, []byte("1\n"))
				return err
			})
			b.StopTimer()
			held = append(held, h) // keep it: the fleet keeps its namespaces too
			if err != nil {
				b.Fatal(err)
			}
			b.StartTimer()
		}
	}
	b.Run("shared-proc", func(b *testing.B) {
		fd, err := unix.Open("/proc", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			b.Fatal(err)
		}
		defer unix.Close(fd)
		write(b, func() int { return fd })
	})
	b.Run("private-procfs", func(b *testing.B) {
		p, err := sysctl.Open()
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		if !p.Private() {
			b.Skip("no fsopen")
		}
		write(b, func() int {
			p.NextNamespace()
			return p.Fd()
		})
	})
}
