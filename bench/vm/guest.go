package vm

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/bench"
	"golang.org/x/sys/unix"
)

// JobPath is where the job lies in the guest's initramfs.
const JobPath = "/nsfleet-job.json"

// PortName names the virtio serial port the results travel on.
const PortName = "nsfleet.results"

// Job is what the guest runs.
type Job struct {
	Scenario string         `json:"scenario"`
	N        int            `json:"n"`
	Mark     int            `json:"mark"`
	Runs     int            `json:"runs"`
	Engines  []string       `json:"engines"`
	Variants []string       `json:"variants"`
	Prefix   string         `json:"prefix"`
	Workers  int            `json:"workers"`
	Globals  map[string]int `json:"globals"` // the scenarios' knobs (idle, namespaces, limit)
	Modules  []string       `json:"modules"` // module files, dependencies first
}

// Result is what comes back over the port.
type Result struct {
	Run     *bench.Run `json:"run,omitempty"`
	Error   string     `json:"error,omitempty"`
	Release string     `json:"release"`
}

// IsGuest reports whether this process is the init of an nsfleet guest.
func IsGuest() bool {
	if os.Getpid() != 1 {
		return false
	}
	_, err := os.Stat(JobPath)
	return err == nil
}

// GuestMain is the guest's init: it mounts what a scenario needs, loads
// the modules, runs the job, sends the result over the virtio port and
// powers the machine off. It never returns.
func GuestMain() {
	res := Result{}
	defer func() {
		if r := recover(); r != nil {
			res.Error = fmt.Sprint("panic: ", r)
		}
		send(res)
		unix.Sync()
		unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
		select {}
	}()
	var uts unix.Utsname
	unix.Uname(&uts)
	res.Release = unix.ByteSliceToString(uts.Release[:])
	for _, m := range []struct{ src, dst, fs string }{
		{"proc", "/proc", "proc"}, {"sysfs", "/sys", "sysfs"}, {"devtmpfs", "/dev", "devtmpfs"},
		{"tmpfs", "/run", "tmpfs"}, {"tmpfs", "/tmp", "tmpfs"},
	} {
		os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.fs, 0, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			res.Error = fmt.Sprintf("mount %s: %v", m.dst, err)
			return
		}
	}
	// The lab's mount-propagation layouts assume systemd's shared root.
	unix.Mount("", "/", "", unix.MS_REC|unix.MS_SHARED, "")
	b, err := os.ReadFile(JobPath)
	if err != nil {
		res.Error = err.Error()
		return
	}
	var job Job
	if err := json.Unmarshal(b, &job); err != nil {
		res.Error = "job: " + err.Error()
		return
	}
	for _, m := range job.Modules {
		if err := loadModule(m); err != nil {
			res.Error = fmt.Sprintf("module %s: %v", filepath.Base(m), err)
			return
		}
	}
	if _, err := os.Stat("/proc/self/ns/net"); err != nil {
		res.Error = "this kernel has no network namespaces (CONFIG_NET_NS)"
		return
	}
	s, err := bench.Lookup(job.Scenario)
	if err != nil {
		res.Error = err.Error()
		return
	}
	bench.IdleMountNamespaces = orDefault(job.Globals["idle"], bench.IdleMountNamespaces)
	bench.UeventNamespaces = orDefault(job.Globals["namespaces"], bench.UeventNamespaces)
	bench.ChurnLimit = orDefault(job.Globals["limit"], bench.ChurnLimit)
	os.Setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
	run, err := bench.Execute(context.Background(), s, bench.Options{N: job.N, Mark: job.Mark, Runs: job.Runs,
		Engines: job.Engines, Variants: job.Variants, Prefix: job.Prefix, Workers: job.Workers})
	res.Run = run
	if err != nil {
		res.Error = err.Error()
	}
}

func orDefault(v, d int) int {
	if v == 0 {
		return d
	}
	return v
}

func loadModule(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.FinitModule(int(f.Fd()), "", 0)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	return err
}

// send writes the result to the virtio port named PortName (waiting for
// the driver to bind it), or, failing that, says so on the console.
func send(res Result) {
	b, _ := json.Marshal(res)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		ports, _ := filepath.Glob("/sys/class/virtio-ports/*/name")
		for _, p := range ports {
			name, _ := os.ReadFile(p)
			if strings.TrimSpace(string(name)) != PortName {
				continue
			}
			dev := "/dev/" + filepath.Base(filepath.Dir(p))
			f, err := os.OpenFile(dev, os.O_WRONLY, 0)
			if err != nil {
				break
			}
			f.Write(b)
			f.Write([]byte("\n"))
			f.Close()
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	mods, _ := os.ReadFile("/proc/modules")
	devs, _ := filepath.Glob("/sys/bus/virtio/devices/*")
	ports, _ := filepath.Glob("/sys/class/virtio-ports/*")
	fmt.Fprintf(os.Stderr, "nsfleet guest: no virtio port %s to send the result on (virtio devices %v, ports %v, modules:\n%s)\n", PortName, devs, ports, mods)
	fmt.Fprintf(os.Stderr, "nsfleet guest: result was: %.300s\n", b)
}
