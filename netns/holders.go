package netns

import (
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Holders says what keeps each of the network namespaces whose inode
// numbers are in inodes alive: processes and threads inside it, open
// files of it (a pin opened, /proc/PID/ns/net), and nsfs mounts of it in
// the caller's mount namespace. It reads /proc of the caller's PID
// namespace; what it cannot read (other users' processes without root,
// processes gone meanwhile) it leaves out, so a namespace may have no
// answer. It walks every task and open file on the machine: it is for the
// rare report of a namespace that would not go, not for a hot path.
func Holders(inodes map[uint64]bool) map[uint64][]string {
	out := map[uint64][]string{}
	add := func(ino uint64, what string) {
		if len(out[ino]) < maxHolders {
			out[ino] = append(out[ino], what)
		}
	}
	// A pin opened by its path shows that path among a process's files,
	// not "net:[N]": such files are told by nsfs's device and the inode.
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
		comm := func() string {
			b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			return strings.TrimSpace(string(b))
		}
		tasks, _ := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		for _, t := range tasks {
			if ino, ok := nsLinkInode(fmt.Sprintf("/proc/%d/task/%s/ns/net", pid, t.Name())); ok && inodes[ino] {
				add(ino, fmt.Sprintf("pid %d (%s) is inside", pid, comm()))
				break
			}
		}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		for _, fd := range fds {
			path := fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())
			target, err := os.Readlink(path)
			if err != nil {
				continue
			}
			ino, ok := ParseNsLink(target)
			var st unix.Stat_t
			if !ok && strings.HasPrefix(target, "/") && nsfs != 0 && unix.Stat(path, &st) == nil && uint64(st.Dev) == nsfs {
				ino, ok = st.Ino, true
			}
			if ok && inodes[ino] {
				add(ino, fmt.Sprintf("pid %d (%s) has it open", pid, comm()))
				break
			}
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
	for ino := range out {
		sort.Strings(out[ino])
	}
	return out
}

// maxHolders bounds what Holders says about one namespace.
const maxHolders = 3

func nsLinkInode(path string) (uint64, bool) {
	target, err := os.Readlink(path)
	if err != nil {
		return 0, false
	}
	return ParseNsLink(target)
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
