package sim

import (
	"context"
	"io"
	"net"
	"os"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/netns"
)

// Proxy forwards connections accepted on 127.0.0.1 to the etcd members in
// the hub namespace (the first that answers), until ctx ends.
func Proxy(ctx context.Context, hubPin, addrFile string, targets []string) error {
	hub, err := netns.OpenPath(hubPin)
	if err != nil {
		return err
	}
	defer hub.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer ln.Close()
	if err := os.WriteFile(addrFile, []byte(ln.Addr().String()), 0o644); err != nil {
		return err
	}
	go func() { <-ctx.Done(); ln.Close() }()
	for {
		c, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			var up net.Conn
			for _, t := range targets {
				t = strings.TrimPrefix(t, "http://")
				// The socket is made inside the hub; it stays there.
				netns.Do(hub, func() error {
					up, err = net.DialTimeout("tcp", t, time.Second)
					return err
				})
				if err == nil {
					break
				}
			}
			if up == nil {
				return
			}
			defer up.Close()
			done := make(chan struct{}, 2)
			go func() { copyConn(up, c); done <- struct{}{} }()
			go func() { copyConn(c, up); done <- struct{}{} }()
			<-done
		}()
	}
}

func copyConn(dst, src net.Conn) {
	io.Copy(dst, src)
	if tc, ok := dst.(*net.TCPConn); ok {
		tc.CloseWrite()
	}
}
