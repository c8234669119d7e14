package netns

import (
	"fmt"
	"strings"
	"testing"
)

const sample = `26 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
41 26 254:0 /run/netns /run/netns rw,relatime shared:5 - ext4 /dev/vda rw
57 41 0:4 net:[4026532281] /run/netns/bar-1 rw shared:6 - nsfs nsfs rw
58 41 0:4 net:[4026532282] /run/netns/with\040space rw master:3 - nsfs nsfs rw
60 26 0:22 / /mnt/private rw - tmpfs tmpfs rw
`

func TestParseMountInfo(t *testing.T) {
	ms, err := ParseMountInfo(strings.NewReader(sample))
	if err != nil {
		t.Fatal(err)
	}
	if len(ms) != 5 {
		t.Fatalf("%d mounts", len(ms))
	}
	if m := ms[2]; m.FSType != "nsfs" || m.MountPoint != "/run/netns/bar-1" || func() uint64 { i, _ := ParseNsLink(m.Root); return i }() != 4026532281 || m.Shared() != 6 {
		t.Fatalf("%+v", m)
	}
	if m := ms[3]; m.MountPoint != "/run/netns/with space" || m.Propagation() != "slave" || m.Master() != 3 {
		t.Fatalf("%+v", m)
	}
	if ms[4].Propagation() != "private" || ms[1].Propagation() != "shared" {
		t.Fatal("propagation")
	}
	rd := &RunDir{Path: "/run/netns"}
	st := rd.stateFrom(ms)
	if !st.IsMountPoint || st.Propagation != "shared" || st.Parent != "/" {
		t.Fatalf("%+v", st)
	}
	st = (&RunDir{Path: "/mnt/private/netns"}).stateFrom(ms)
	if st.IsMountPoint || st.Parent != "/mnt/private" || st.Propagation != "private" {
		t.Fatalf("%+v", st)
	}
}

func TestParseMountInfoRefuses(t *testing.T) {
	for _, bad := range []string{"x 1 0:1 / / rw - ext4 a rw", "1 1 0:1 / / rw", "1 2 3"} {
		if _, err := ParseMountInfo(strings.NewReader(bad)); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

func FuzzParseMountInfo(f *testing.F) {
	f.Add(sample)
	f.Add("1 2 3 4 5 6 - a b c\n")
	f.Add(`1 1 0:1 /\134 /\0 rw - x y z`)
	f.Fuzz(func(t *testing.T, s string) {
		ms, err := ParseMountInfo(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, m := range ms {
			_ = m.Propagation()
			_, _ = ParseNsLink(m.Root)
		}
	})
}

func FuzzParseNsLink(f *testing.F) {
	for _, s := range []string{"net:[4026532008]", "net:[]", "mnt:[1]", "net:[+1]", "net:[18446744073709551616]", "net:[012]", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		ino, ok := ParseNsLink(s)
		if ok && s != fmt.Sprintf("net:[%d]", ino) {
			t.Fatalf("%q read as %d", s, ino)
		}
	})
}
