package kprof

import (
	"bytes"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	"github.com/nsfleet/nsfleet/internal/nstest"
	"golang.org/x/sys/unix"
)

func TestMain(m *testing.M) { nstest.Main(m) }

const switchFormatText = `name: sched_switch
ID: 316
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:unsigned char common_flags;	offset:2;	size:1;	signed:0;
	field:unsigned char common_preempt_count;	offset:3;	size:1;	signed:0;
	field:int common_pid;	offset:4;	size:4;	signed:1;

	field:char prev_comm[16];	offset:8;	size:16;	signed:0;
	field:pid_t prev_pid;	offset:24;	size:4;	signed:1;
	field:int prev_prio;	offset:28;	size:4;	signed:1;
	field:long prev_state;	offset:32;	size:8;	signed:1;
	field:char next_comm[16];	offset:40;	size:16;	signed:0;
	field:pid_t next_pid;	offset:56;	size:4;	signed:1;
	field:int next_prio;	offset:60;	size:4;	signed:1;
`

func TestParseSwitchFormat(t *testing.T) {
	f, err := parseSwitchFormat(switchFormatText)
	if err != nil {
		t.Fatal(err)
	}
	if f.prevPID != 24 || f.nextPID != 56 || f.prevState != 32 || f.stateSize != 8 {
		t.Fatalf("offsets %+v", f)
	}
	raw := make([]byte, 64)
	raw[24], raw[56], raw[32] = 7, 9, 1
	prev, next, state, ok := f.parse(raw)
	if !ok || prev != 7 || next != 9 || state != 1 {
		t.Fatalf("parse: %d %d %d %v", prev, next, state, ok)
	}
	if _, _, _, ok := f.parse(raw[:40]); ok {
		t.Fatal("a short record parsed")
	}
	if _, err := parseSwitchFormat("field:int x; offset:0; size:4;"); err == nil {
		t.Fatal("a format without the fields parsed")
	}
}

func FuzzParseSwitchFormat(f *testing.F) {
	f.Add(switchFormatText, []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, text string, raw []byte) {
		sf, err := parseSwitchFormat(text)
		if err != nil {
			return
		}
		sf.parse(raw) // must not panic, whatever the offsets
	})
}

func TestIsGo(t *testing.T) {
	for name, want := range map[string]bool{
		"github.com/nsfleet/nsfleet/fleet.Up": true, "runtime.mallocgc": true,
		"rtnl_fill_ifinfo.isra.0": false, "idr_for_each": false, "[ip]": false,
	} {
		if isGo(name) != want {
			t.Errorf("isGo(%q) = %v", name, !want)
		}
	}
}

// TestProfileOwnWork samples this process while it makes system calls
// in two marked ranges, then reads the profile back with pprof's reader.
func TestProfileOwnWork(t *testing.T) {
	nstest.RequireRoot(t)
	p, err := Start(Options{Frequency: 499})
	if err != nil {
		t.Skip("perf events unavailable:", err)
	}
	busy := func(d time.Duration) {
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			unix.Getpid()
			var st unix.Stat_t
			unix.Stat("/proc/self", &st)
		}
	}
	p.Mark("first")
	busy(300 * time.Millisecond)
	p.Mark("second")
	busy(300 * time.Millisecond)
	time.Sleep(50 * time.Millisecond) // off-CPU
	r, err := p.Stop()
	if err != nil {
		t.Fatal(err)
	}
	ours := 0
	for _, s := range r.Samples {
		if s.PID == os.Getpid() && s.OffCPU == 0 {
			ours++
		}
	}
	if ours < 50 {
		t.Fatalf("%d on-CPU samples of this process in 0.6 s at 499 Hz", ours)
	}
	var buf bytes.Buffer
	if err := r.WritePprof(&buf, os.Getpid()); err != nil {
		t.Fatal(err)
	}
	prof, err := profile.Parse(&buf)
	if err != nil {
		t.Fatalf("pprof cannot read it: %v", err)
	}
	ranges, kernel, goFn := map[string]bool{}, false, false
	for _, s := range prof.Sample {
		for _, l := range s.Label["range"] {
			ranges[l] = true
		}
		for _, loc := range s.Location {
			name := loc.Line[0].Function.Name
			kernel = kernel || strings.Contains(name, "sys_") || strings.Contains(name, "syscall")
			goFn = goFn || strings.Contains(name, "kprof.TestProfileOwnWork")
		}
	}
	if !ranges["first"] || !ranges["second"] {
		t.Errorf("ranges in the profile: %v", ranges)
	}
	if !kernel || !goFn {
		t.Errorf("kernel frames %v, this test's own frames %v", kernel, goFn)
	}
	var svg bytes.Buffer
	if err := r.WriteFlame(&svg, 1, "first", os.Getpid()); err != nil || !strings.Contains(svg.String(), "<rect") {
		t.Errorf("flame graph: %v", err)
	}
	if len(r.Top(-1, 5)) == 0 {
		t.Error("no top kernel functions")
	}
}
