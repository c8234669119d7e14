package netns

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ProcHolds is what one walk of /proc found about namespaces: which
// processes are inside each network namespace and which hold one open,
// and one process per mount namespace. It is the one holder search of
// nsfleet (Holders and doctor read it).
type ProcHolds struct {
	// Inside maps a network namespace (inode) to the processes with a
	// thread in it, each process once.
	Inside map[uint64][]int
	// Open maps a network namespace to the processes holding it open: a
	// /proc/PID/ns/net link ("net:[N]") or a pin opened by its path
	// (nsfs's device and the inode tell those), each process once.
	Open map[uint64][]int
	// MountNS maps each mount namespace (inode) to one process in it.
	MountNS map[uint64]int
	// Path names, for each network namespace found, one /proc path that
	// opens it (a task's ns link or an open file).
	Path map[uint64]string
}

// ScanProcs walks /proc of the caller's PID namespace once: every task
// and open file on the machine. What it cannot read (other users'
// processes without root, processes gone meanwhile) it leaves out. It is
// for reports (doctor, a namespace that would not go), not a hot path.
func ScanProcs() *ProcHolds {
	s := &ProcHolds{Inside: map[uint64][]int{}, Open: map[uint64][]int{}, MountNS: map[uint64]int{}, Path: map[uint64]string{}}
	var self unix.Stat_t
	nsfs := uint64(0)
	if unix.Stat("/proc/self/ns/net", &self) == nil {
		nsfs = uint64(self.Dev)
	}
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil {
			continue
		}
		base := "/proc/" + p.Name()
		if ino, ok := nsInode(base + "/ns/mnt"); ok {
			if _, seen := s.MountNS[ino]; !seen {
				s.MountNS[ino] = pid
			}
		}
		inside := map[uint64]bool{}
		tasks, _ := os.ReadDir(base + "/task")
		for _, t := range tasks {
			path := base + "/task/" + t.Name() + "/ns/net"
			if ino, ok := nsInode(path); ok && !inside[ino] {
				inside[ino] = true
				s.seen(ino, path)
				s.Inside[ino] = append(s.Inside[ino], pid)
			}
		}
		open := map[uint64]bool{}
		fds, _ := os.ReadDir(base + "/fd")
		for _, fd := range fds {
			path := base + "/fd/" + fd.Name()
			target, err := os.Readlink(path)
			if err != nil {
				continue
			}
			ino, ok := ParseNsLink(target)
			var st unix.Stat_t
			if !ok && strings.HasPrefix(target, "/") && nsfs != 0 && unix.Stat(path, &st) == nil && uint64(st.Dev) == nsfs {
				ino, ok = st.Ino, true
			}
			if ok && !open[ino] {
				open[ino] = true
				s.seen(ino, path)
				s.Open[ino] = append(s.Open[ino], pid)
			}
		}
	}
	return s
}

func (s *ProcHolds) seen(ino uint64, path string) {
	if _, ok := s.Path[ino]; !ok {
		s.Path[ino] = path
	}
}

// Comm is a process's command name, or "" if it is gone.
func Comm(pid int) string {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	return strings.TrimSpace(string(b))
}

// Holders says what keeps each of the network namespaces whose inode
// numbers are in inodes alive: processes and threads inside it, open
// files of it, and nsfs mounts of it in the caller's mount namespace (see
// ScanProcs for what it reads), at most a few lines each, so a namespace
// may have no answer.
func Holders(inodes map[uint64]bool) map[uint64][]string {
	out := map[uint64][]string{}
	add := func(ino uint64, what string) {
		if len(out[ino]) < maxHolders {
			out[ino] = append(out[ino], what)
		}
	}
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		_ = scanMountInfo(f, func(m *Mount) {
			if ino, ok := ParseNsLink(m.Root); ok && m.FSType == "nsfs" && inodes[ino] {
				add(ino, "mounted at "+m.MountPoint)
			}
		})
		f.Close()
	}
	s := ScanProcs()
	for ino := range inodes {
		for _, pid := range s.Inside[ino] {
			add(ino, fmt.Sprintf("pid %d (%s) is inside", pid, Comm(pid)))
		}
		for _, pid := range s.Open[ino] {
			add(ino, fmt.Sprintf("pid %d (%s) has it open", pid, Comm(pid)))
		}
	}
	for ino := range out {
		sort.Strings(out[ino])
	}
	return out
}

// maxHolders bounds what Holders says about one namespace.
const maxHolders = 3

// nsInode is the inode of the namespace a /proc ns link names.
func nsInode(path string) (uint64, bool) {
	var st unix.Stat_t
	if unix.Stat(path, &st) != nil {
		return 0, false
	}
	return st.Ino, true
}

// ParseNsLink reads a network namespace's inode number from what its
// links under /proc say ("net:[4026532008]"), or an nsfs mount's root
// says; false for anything else.
func ParseNsLink(s string) (uint64, bool) {
	rest, ok := strings.CutPrefix(s, "net:[")
	if !ok {
		return 0, false
	}
	digits, ok := strings.CutSuffix(rest, "]")
	if !ok || digits == "" || digits[0] < '1' || digits[0] > '9' { // as the kernel prints them
		return 0, false
	}
	ino, err := strconv.ParseUint(digits, 10, 64)
	return ino, err == nil
}
