// Package kprof samples where the time goes while nsfleet works, in the
// kernel and in nsfleet, with the perf events this machine has: the
// cpu-clock software event (works in VMs without a PMU) on every CPU, with
// kernel and user call chains, and the sched_switch tracepoint for the
// time nsfleet's own threads spend blocked (off-CPU: synchronize_rcu,
// mutexes, waits on kernel workers). kprobes are not needed.
//
// Samples are cut into ranges by Mark (the steps or marks of the work being
// measured), and written as a pprof profile (go tool pprof reads it), as
// flame graphs (SVG), and as a table of the kernel functions whose share
// grows from the first range to the last.
//
// Threading: Start opens one event per CPU and reads them on one goroutine
// of its own; Mark may be called from any goroutine.
package kprof

import (
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Options of Start. The zero value samples at DefaultFrequency with
// off-CPU time.
type Options struct {
	Frequency int  // cpu-clock samples per second per CPU; 0: DefaultFrequency
	NoOffCPU  bool // leave out sched_switch (off-CPU time)
}

// DefaultFrequency is odd, so that sampling does not lock onto periodic work.
const DefaultFrequency = 999

// Sample is one on-CPU sample (OffCPU 0) or one blocked interval of one of
// this process's threads (OffCPU > 0).
type Sample struct {
	Time   time.Duration // CLOCK_MONOTONIC
	PID    int           // thread group
	TID    int
	CPU    int
	Stack  []uint64 // leaf first; kernel frames, then user frames
	NKern  int      // how many of Stack are kernel frames
	OffCPU time.Duration
}

// Range is a labelled span of the run: from its mark to the next.
type Range struct {
	Label string
	Start time.Duration
}

// Profiler is a sampling session.
type Profiler struct {
	freq   int
	events []*event
	stop   chan struct{}
	done   chan struct{}
	self   int

	mu      sync.Mutex
	samples []Sample
	ranges  []Range
	lost    uint64
	notes   []string

	switchFmt switchFormat
	pending   map[int]Sample // a thread of ours switched out, blocked
}

type event struct {
	fd     int
	mm     []byte
	cpu    int
	offCPU bool // a sched_switch event, not cpu-clock
}

func now() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return time.Duration(ts.Nano())
}

// Start begins sampling every CPU. It fails when perf events are not
// available (not root, perf_event_paranoid, no perf support); off-CPU
// sampling that cannot start is left out with a note.
func Start(o Options) (*Profiler, error) {
	p := &Profiler{freq: o.Frequency, stop: make(chan struct{}), done: make(chan struct{}), self: os.Getpid(), pending: map[int]Sample{}}
	if p.freq <= 0 {
		p.freq = DefaultFrequency
	}
	cpus := runtime.NumCPU()
	for cpu := 0; cpu < cpus; cpu++ {
		e, err := openCPUClock(cpu, p.freq)
		if err != nil {
			p.close()
			return nil, fmt.Errorf("profile: cpu-clock on CPU %d: %w (needs root or kernel.perf_event_paranoid <= 1)", cpu, err)
		}
		p.events = append(p.events, e)
	}
	if !o.NoOffCPU {
		if err := p.openSwitches(cpus); err != nil {
			p.notes = append(p.notes, "off-CPU time left out: "+err.Error())
		}
	}
	p.ranges = []Range{{Label: "start", Start: now()}}
	for _, e := range p.events {
		if err := unix.IoctlSetInt(e.fd, unix.PERF_EVENT_IOC_ENABLE, 0); err != nil {
			p.close()
			return nil, fmt.Errorf("profile: enable: %w", err)
		}
	}
	go p.read()
	return p, nil
}

func (p *Profiler) openSwitches(cpus int) error {
	id, f, err := schedSwitch()
	if err != nil {
		return err
	}
	p.switchFmt = f
	var evs []*event
	for cpu := 0; cpu < cpus; cpu++ {
		attr := unix.PerfEventAttr{
			Type:             unix.PERF_TYPE_TRACEPOINT,
			Config:           id,
			Sample:           1,
			Sample_type:      unix.PERF_SAMPLE_TID | unix.PERF_SAMPLE_TIME | unix.PERF_SAMPLE_CPU | unix.PERF_SAMPLE_CALLCHAIN | unix.PERF_SAMPLE_RAW,
			Bits:             unix.PerfBitDisabled | unix.PerfBitUseClockID,
			Clockid:          unix.CLOCK_MONOTONIC,
			Sample_max_stack: 64,
		}
		attr.Size = uint32(unsafe.Sizeof(attr))
		e, err := openEvent(&attr, cpu, 256)
		if err != nil {
			for _, e := range evs {
				e.close()
			}
			return fmt.Errorf("sched_switch on CPU %d: %w", cpu, err)
		}
		e.offCPU = true
		evs = append(evs, e)
		// Only switches in or out of a thread called as this process is:
		// call chains of every other task's switches would cost more
		// than all the rest of the profiler.
		if err := setFilter(e.fd, p.switchFilter()); err != nil {
			for _, e := range evs {
				e.close()
			}
			return fmt.Errorf("sched_switch filter: %w", err)
		}
	}
	p.events = append(p.events, evs...)
	return nil
}

func openCPUClock(cpu, freq int) (*event, error) {
	attr := unix.PerfEventAttr{
		Type:             unix.PERF_TYPE_SOFTWARE,
		Config:           unix.PERF_COUNT_SW_CPU_CLOCK,
		Sample:           uint64(freq),
		Sample_type:      unix.PERF_SAMPLE_TID | unix.PERF_SAMPLE_TIME | unix.PERF_SAMPLE_CPU | unix.PERF_SAMPLE_CALLCHAIN,
		Bits:             unix.PerfBitDisabled | unix.PerfBitFreq | unix.PerfBitUseClockID,
		Clockid:          unix.CLOCK_MONOTONIC,
		Sample_max_stack: 127,
	}
	attr.Size = uint32(unsafe.Sizeof(attr))
	return openEvent(&attr, cpu, 64)
}

func openEvent(attr *unix.PerfEventAttr, cpu, pages int) (*event, error) {
	fd, err := unix.PerfEventOpen(attr, -1, cpu, -1, unix.PERF_FLAG_FD_CLOEXEC)
	if err != nil {
		return nil, err
	}
	mm, err := unix.Mmap(fd, 0, (1+pages)*os.Getpagesize(), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("mmap: %w", err)
	}
	return &event{fd: fd, mm: mm, cpu: cpu}, nil
}

func (e *event) close() {
	unix.Munmap(e.mm)
	unix.Close(e.fd)
}

func (p *Profiler) close() {
	for _, e := range p.events {
		e.close()
	}
	p.events = nil
}

// Mark starts a new range called label (e.g. "250" when 250 namespaces
// are done, or a step's name).
func (p *Profiler) Mark(label string) {
	t := now()
	p.mu.Lock()
	p.ranges = append(p.ranges, Range{Label: label, Start: t})
	p.mu.Unlock()
}

// Result is what a session recorded.
type Result struct {
	Frequency int
	Samples   []Sample
	Ranges    []Range
	End       time.Duration
	Lost      uint64
	Notes     []string
	syms      *symbols
	comms     map[int]string
}

// Stop ends sampling and returns the samples.
func (p *Profiler) Stop() (*Result, error) {
	close(p.stop)
	<-p.done
	for _, e := range p.events {
		unix.IoctlSetInt(e.fd, unix.PERF_EVENT_IOC_DISABLE, 0)
	}
	p.drain()
	p.close()
	r := &Result{Frequency: p.freq, Samples: p.samples, Ranges: p.ranges, End: now(), Lost: p.lost, Notes: p.notes}
	if p.lost > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%d samples lost (ring buffers full)", p.lost))
	}
	var err error
	if r.syms, err = loadKallsyms(); err != nil {
		r.Notes = append(r.Notes, "kernel symbols unreadable: "+err.Error())
	}
	r.dropIdleWaits()
	r.comms = map[int]string{}
	for _, s := range r.Samples {
		if _, ok := r.comms[s.PID]; !ok {
			r.comms[s.PID] = commOf(s.PID)
		}
	}
	return r, nil
}

func commOf(pid int) string {
	if pid == 0 {
		return "swapper"
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/comm")
	if err != nil {
		return "pid " + strconv.Itoa(pid)
	}
	return strings.TrimSpace(string(b))
}

func (p *Profiler) read() {
	defer close(p.done)
	fds := make([]unix.PollFd, len(p.events))
	for i, e := range p.events {
		fds[i] = unix.PollFd{Fd: int32(e.fd), Events: unix.POLLIN}
	}
	for {
		select {
		case <-p.stop:
			return
		default:
		}
		unix.Poll(fds, 50)
		p.drain()
	}
}

// drain reads every ring buffer up to its head.
func (p *Profiler) drain() {
	for _, e := range p.events {
		p.drainOne(e)
	}
}

// The ring buffer's control page: data_head at 1024, data_tail at 1032,
// data_offset at 1040, data_size at 1048 (struct perf_event_mmap_page).
func (p *Profiler) drainOne(e *event) {
	meta := (*unix.PerfEventMmapPage)(unsafe.Pointer(&e.mm[0]))
	head := atomicLoad(&meta.Data_head)
	tail := meta.Data_tail
	off, size := meta.Data_offset, meta.Data_size
	if off == 0 {
		off, size = uint64(os.Getpagesize()), uint64(len(e.mm)-os.Getpagesize())
	}
	data := e.mm[off : off+size]
	var rec []byte
	for tail < head {
		start := tail % size
		hdr := make([]byte, 8)
		copyRing(hdr, data, start)
		typ := binary.NativeEndian.Uint32(hdr[0:4])
		n := uint64(binary.NativeEndian.Uint16(hdr[6:8]))
		if n < 8 {
			break
		}
		if uint64(cap(rec)) < n {
			rec = make([]byte, n)
		}
		rec = rec[:n]
		copyRing(rec, data, start)
		switch typ {
		case unix.PERF_RECORD_SAMPLE:
			p.sample(e, rec[8:])
		case unix.PERF_RECORD_LOST:
			if len(rec) >= 24 {
				p.lost += binary.NativeEndian.Uint64(rec[16:24])
			}
		}
		tail += n
	}
	atomicStore(&meta.Data_tail, tail)
}

func copyRing(dst, ring []byte, start uint64) {
	n := copy(dst, ring[start:])
	if n < len(dst) {
		copy(dst[n:], ring)
	}
}

func (p *Profiler) sample(e *event, b []byte) {
	// PERF_SAMPLE_TID, TIME, CPU, CALLCHAIN, then RAW for sched_switch.
	if len(b) < 32 {
		return
	}
	s := Sample{
		PID:  int(binary.NativeEndian.Uint32(b[0:4])),
		TID:  int(binary.NativeEndian.Uint32(b[4:8])),
		Time: time.Duration(binary.NativeEndian.Uint64(b[8:16])),
		CPU:  int(binary.NativeEndian.Uint32(b[16:20])),
	}
	nr := binary.NativeEndian.Uint64(b[24:32])
	b = b[32:]
	if uint64(len(b)) < nr*8 {
		return
	}
	kernel := false
	for i := uint64(0); i < nr; i++ {
		ip := binary.NativeEndian.Uint64(b[i*8:])
		switch {
		case ip == contextKernel:
			kernel = true
			continue
		case ip >= contextMax:
			kernel = false
			continue
		}
		s.Stack = append(s.Stack, ip)
		if kernel {
			s.NKern++
		}
	}
	b = b[nr*8:]
	if !e.offCPU {
		p.mu.Lock()
		p.samples = append(p.samples, s)
		p.mu.Unlock()
		return
	}
	if len(b) < 4 {
		return
	}
	raw := b[4:]
	prevPID, nextPID, prevState, ok := p.switchFmt.parse(raw)
	if !ok {
		return
	}
	// The switched-out thread is s.TID. Keep ours when it blocks.
	if s.PID == p.self && prevState != 0 && prevPID == s.TID {
		p.pending[s.TID] = s
	}
	if w, ok := p.pending[nextPID]; ok {
		delete(p.pending, nextPID)
		w.OffCPU = s.Time - w.Time
		if w.OffCPU > 0 {
			p.mu.Lock()
			p.samples = append(p.samples, w)
			p.mu.Unlock()
		}
	}
}

// Call chain context markers (PERF_CONTEXT_*): values at the top of the
// address space.
const (
	contextKernel = uint64(0xffffffffffffff80) // PERF_CONTEXT_KERNEL
	contextMax    = uint64(0xfffffffffffff001) // PERF_CONTEXT_MAX
)

// dropIdleWaits leaves out off-CPU intervals spent in idle waits: the Go
// runtime's (futex sleeps of parked threads, the network poller's
// epoll_wait, sysmon's nanosleep) and the profiler's own poll. They say
// that a thread had nothing to do, not what the work waited for.
func (r *Result) dropIdleWaits() {
	kept := r.Samples[:0]
	dropped := 0
	for _, s := range r.Samples {
		if s.OffCPU > 0 && r.idleWait(&s) {
			dropped++
			continue
		}
		kept = append(kept, s)
	}
	r.Samples = kept
	if dropped > 0 {
		r.Notes = append(r.Notes, fmt.Sprintf("%d off-CPU intervals in idle waits (futex, epoll_wait, nanosleep, poll) left out", dropped))
	}
}

func (r *Result) idleWait(s *Sample) bool {
	for i := 0; i < s.NKern; i++ {
		switch r.syms.lookup(s.Stack[i]) {
		case "__futex_wait", "futex_wait", "do_epoll_wait", "ep_poll", "do_nanosleep", "do_sys_poll":
			return true
		}
	}
	return false
}
