package netns

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
)

// Mount is one line of /proc/self/mountinfo (proc(5)).
type Mount struct {
	ID         int
	Parent     int
	Dev        string // major:minor
	Root       string
	MountPoint string
	Options    string
	Optional   []string // e.g. "shared:1", "master:2", "unbindable"
	FSType     string
	Source     string
}

// Shared reports the peer group of a shared mount, or 0.
func (m Mount) Shared() int { return m.optionalInt("shared:") }

// Master reports the peer group a slave mount receives from, or 0.
func (m Mount) Master() int { return m.optionalInt("master:") }

func (m Mount) optionalInt(prefix string) int {
	for _, o := range m.Optional {
		if strings.HasPrefix(o, prefix) {
			n, _ := strconv.Atoi(o[len(prefix):])
			return n
		}
	}
	return 0
}

// Propagation names the mount's propagation type as mount(8) does:
// shared, slave, shared+slave, unbindable or private.
func (m Mount) Propagation() string {
	s, sl := m.Shared() != 0, m.Master() != 0
	switch {
	case s && sl:
		return "shared+slave"
	case s:
		return "shared"
	case sl:
		return "slave"
	}
	for _, o := range m.Optional {
		if o == "unbindable" {
			return "unbindable"
		}
	}
	return "private"
}

// ReadMountInfo parses /proc/self/mountinfo.
func ReadMountInfo() ([]Mount, error) {
	var out []Mount
	err := ScanMountInfo(func(m *Mount) { out = append(out, *m) })
	return out, err
}

// ScanMountInfo calls fn with each mount of /proc/self/mountinfo, read and
// parsed one line at a time: on a host with tens of thousands of pins the
// table is megabytes, and most callers keep a few mounts of it.
func ScanMountInfo(fn func(*Mount)) error {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return fmt.Errorf("read mountinfo: %w", err)
	}
	defer f.Close()
	return scanMountInfo(f, fn)
}

// ParseMountInfo parses text in the format of /proc/PID/mountinfo.
func ParseMountInfo(r io.Reader) ([]Mount, error) {
	var out []Mount
	if err := scanMountInfo(r, func(m *Mount) { out = append(out, *m) }); err != nil {
		return nil, err
	}
	return out, nil
}

func scanMountInfo(r io.Reader, fn func(*Mount)) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	n := 0
	for sc.Scan() {
		n++
		line := sc.Text()
		if line == "" {
			continue
		}
		m, err := parseMountLine(line)
		if err != nil {
			return fmt.Errorf("mountinfo line %d: %w", n, err)
		}
		fn(&m)
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("mountinfo: %w", err)
	}
	return nil
}

func parseMountLine(line string) (Mount, error) {
	f := strings.Split(line, " ")
	sep := -1
	for i := 6; i < len(f); i++ {
		if f[i] == "-" {
			sep = i
			break
		}
	}
	if len(f) < 10 || sep < 0 || len(f) < sep+3 {
		return Mount{}, fmt.Errorf("malformed line %q", line)
	}
	var m Mount
	var err error
	if m.ID, err = strconv.Atoi(f[0]); err != nil {
		return Mount{}, fmt.Errorf("mount id %q: %w", f[0], err)
	}
	if m.Parent, err = strconv.Atoi(f[1]); err != nil {
		return Mount{}, fmt.Errorf("parent id %q: %w", f[1], err)
	}
	m.Dev = f[2]
	m.Root = unescapeOctal(f[3])
	m.MountPoint = unescapeOctal(f[4])
	m.Options = f[5]
	if sep > 6 {
		m.Optional = f[6:sep]
	}
	m.FSType = f[sep+1]
	m.Source = unescapeOctal(f[sep+2])
	return m, nil
}

// unescapeOctal undoes the kernel's \NNN escaping of space, tab, newline and
// backslash in paths.
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
