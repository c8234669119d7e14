package kprof

// The sched_switch tracepoint (its id and raw record layout, from a
// tracefs of nsfleet's own, and its filter) and the kernel's symbols.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// switchFormat locates sched_switch's fields in its raw record.
type switchFormat struct {
	prevPID, nextPID, prevState int // offsets; sizes 4, 4, 8 or 4
	stateSize                   int
}

func (f switchFormat) parse(raw []byte) (prev, next int, state int64, ok bool) {
	if f.nextPID == 0 || len(raw) < f.nextPID+4 || len(raw) < f.prevPID+4 || len(raw) < f.prevState+f.stateSize {
		return 0, 0, 0, false
	}
	prev = int(int32(binary.NativeEndian.Uint32(raw[f.prevPID:])))
	next = int(int32(binary.NativeEndian.Uint32(raw[f.nextPID:])))
	if f.stateSize == 8 {
		state = int64(binary.NativeEndian.Uint64(raw[f.prevState:]))
	} else {
		state = int64(int32(binary.NativeEndian.Uint32(raw[f.prevState:])))
	}
	return prev, next, state, true
}

// parseSwitchFormat reads the offsets from tracefs's format file.
func parseSwitchFormat(text string) (switchFormat, error) {
	var f switchFormat
	found := 0
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if !strings.HasPrefix(line, "field:") {
			continue
		}
		var decl string
		off, size := -1, -1
		for _, part := range strings.Split(line, ";") {
			part = strings.TrimSpace(part)
			switch {
			case strings.HasPrefix(part, "field:"):
				decl = strings.TrimPrefix(part, "field:")
			case strings.HasPrefix(part, "offset:"):
				off, _ = strconv.Atoi(strings.TrimPrefix(part, "offset:"))
			case strings.HasPrefix(part, "size:"):
				size, _ = strconv.Atoi(strings.TrimPrefix(part, "size:"))
			}
		}
		fields := strings.Fields(decl)
		if len(fields) == 0 || off < 0 {
			continue
		}
		switch fields[len(fields)-1] {
		case "prev_pid":
			f.prevPID = off
			found++
		case "next_pid":
			f.nextPID = off
			found++
		case "prev_state":
			f.prevState, f.stateSize = off, size
			found++
		}
	}
	if found != 3 || (f.stateSize != 4 && f.stateSize != 8) {
		return switchFormat{}, errors.New("sched_switch format without prev_pid, next_pid and prev_state")
	}
	return f, nil
}

// schedSwitch returns the tracepoint id and format of sched:sched_switch,
// from a tracefs instance of nsfleet's own (fsopen/fsmount: nothing is
// mounted where anyone sees it).
func schedSwitch() (uint64, switchFormat, error) {
	fs, err := unix.Fsopen("tracefs", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return 0, switchFormat{}, fmt.Errorf("tracefs: %w", err)
	}
	defer unix.Close(fs)
	if err := unix.FsconfigCreate(fs); err != nil {
		return 0, switchFormat{}, fmt.Errorf("tracefs: %w", err)
	}
	mnt, err := unix.Fsmount(fs, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return 0, switchFormat{}, fmt.Errorf("tracefs: %w", err)
	}
	defer unix.Close(mnt)
	read := func(path string) (string, error) {
		fd, err := unix.Openat(mnt, path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", err
		}
		f := os.NewFile(uintptr(fd), path)
		defer f.Close()
		var b strings.Builder
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			b.WriteString(sc.Text())
			b.WriteByte('\n')
		}
		return b.String(), sc.Err()
	}
	idText, err := read("events/sched/sched_switch/id")
	if err != nil {
		return 0, switchFormat{}, fmt.Errorf("sched_switch id: %w", err)
	}
	id, err := strconv.ParseUint(strings.TrimSpace(idText), 10, 64)
	if err != nil {
		return 0, switchFormat{}, fmt.Errorf("sched_switch id %q: %w", idText, err)
	}
	text, err := read("events/sched/sched_switch/format")
	if err != nil {
		return 0, switchFormat{}, fmt.Errorf("sched_switch format: %w", err)
	}
	f, err := parseSwitchFormat(text)
	return id, f, err
}

// symbols are the kernel's, from /proc/kallsyms.
type symbols struct {
	addr []uint64
	name []string
}

func loadKallsyms() (*symbols, error) {
	f, err := os.Open("/proc/kallsyms")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	type sym struct {
		a uint64
		n string
	}
	var all []sym
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 3 {
			continue
		}
		if t := fs[1]; t != "t" && t != "T" && t != "W" && t != "w" {
			continue
		}
		a, err := strconv.ParseUint(fs[0], 16, 64)
		if err != nil || a == 0 {
			continue
		}
		all = append(all, sym{a, fs[2]})
	}
	if len(all) == 0 {
		return nil, errors.New("no addresses in /proc/kallsyms (kernel.kptr_restrict?)")
	}
	sort.Slice(all, func(i, j int) bool { return all[i].a < all[j].a })
	s := &symbols{addr: make([]uint64, len(all)), name: make([]string, len(all))}
	for i, x := range all {
		s.addr[i], s.name[i] = x.a, x.n
	}
	return s, sc.Err()
}

func (s *symbols) lookup(a uint64) string {
	if s == nil {
		return fmt.Sprintf("kernel 0x%x", a)
	}
	i := sort.Search(len(s.addr), func(i int) bool { return s.addr[i] > a }) - 1
	if i < 0 {
		return fmt.Sprintf("kernel 0x%x", a)
	}
	return s.name[i]
}

// switchFilter selects the switches of this process's threads by name
// (Go does not rename its threads; other processes of the same name are
// let through and left out later by their thread group).
func (p *Profiler) switchFilter() string {
	comm := commOf(p.self)
	comm = strings.NewReplacer(`"`, "", `\`, "").Replace(comm)
	return fmt.Sprintf(`prev_comm == "%s" || next_comm == "%s"`, comm, comm)
}

func setFilter(fd int, filter string) error {
	b := append([]byte(filter), 0)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), uintptr(unix.PERF_EVENT_IOC_SET_FILTER), uintptr(unsafe.Pointer(&b[0])))
	runtime.KeepAlive(b)
	if errno != 0 {
		return errno
	}
	return nil
}
