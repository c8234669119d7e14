package rtnl

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"
)

// FuzzLinkNameAndNsid: a notification of a link is read without a panic
// or a name longer than the message.
func FuzzLinkNameAndNsid(f *testing.F) {
	msg := make([]byte, unix.SizeofIfInfomsg)
	attr := func(t uint16, v []byte) []byte {
		b := make([]byte, 4, 4+len(v)+3)
		binary.NativeEndian.PutUint16(b[0:2], uint16(4+len(v)))
		binary.NativeEndian.PutUint16(b[2:4], t)
		b = append(b, v...)
		for len(b)%4 != 0 {
			b = append(b, 0)
		}
		return b
	}
	id := make([]byte, 4)
	binary.NativeEndian.PutUint32(id, 7)
	f.Add(append(append(append([]byte(nil), msg...), attr(unix.IFLA_IFNAME, []byte("qro-1\x00"))...), attr(unix.IFLA_LINK_NETNSID, id)...))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		name, _ := linkNameAndNsid(b)
		if len(name) > len(b) {
			t.Fatalf("name longer than the message")
		}
	})
}
