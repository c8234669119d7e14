package bench

import (
	"bufio"
	"os"
	"os/exec"
	"runtime"
	"strings"

	"github.com/nsfleet/nsfleet/doctor"
	"github.com/nsfleet/nsfleet/internal/version"
	"github.com/nsfleet/nsfleet/netns"
	"golang.org/x/sys/unix"
)

// Env is what a result was measured on.
type Env struct {
	Kernel     string            `json:"kernel"`
	Cmdline    string            `json:"cmdline"`
	CPU        string            `json:"cpu"`
	CPUs       int               `json:"cpus"`
	MemoryMiB  int               `json:"memory_mib"`
	Config     map[string]string `json:"kernel_config,omitempty"` // the options the reports blame
	Sysctls    map[string]string `json:"sysctls"`
	RunDirProp string            `json:"run_dir_propagation"`
	Iproute2   string            `json:"iproute2"`
	Nsfleet    string            `json:"nsfleet"`
	Go         string            `json:"go"`
}

// configKeys are the kernel options the reports blame.
var configKeys = []string{
	"CONFIG_HZ", "CONFIG_PREEMPT", "CONFIG_PREEMPT_NONE", "CONFIG_PREEMPT_VOLUNTARY", "CONFIG_PREEMPT_DYNAMIC",
	"CONFIG_RCU_NOCB_CPU", "CONFIG_RCU_NOCB_CPU_ALL", "CONFIG_RCU_NOCB_CPU_DEFAULT_ALL", "CONFIG_RCU_FAST_NO_HZ",
	"CONFIG_RCU_LAZY", "CONFIG_RCU_EXPERT", "CONFIG_NO_HZ_FULL", "CONFIG_NO_HZ_IDLE",
}

var sysctlPaths = map[string]string{
	"user.max_net_namespaces":           "/proc/sys/user/max_net_namespaces",
	"fs.mount-max":                      "/proc/sys/fs/mount-max",
	"net.core.devconf_inherit_init_net": "/proc/sys/net/core/devconf_inherit_init_net",
	"net.ipv4.neigh.default.gc_thresh3": "/proc/sys/net/ipv4/neigh/default/gc_thresh3",
	"kernel.rcu_expedited (sysfs)":      "/sys/kernel/rcu_expedited",
	"kernel.rcu_normal (sysfs)":         "/sys/kernel/rcu_normal",
}

// CaptureEnv reads the environment; runDir is the run dir the scenario
// uses (its propagation is recorded).
func CaptureEnv(runDir string) Env {
	e := Env{CPUs: runtime.NumCPU(), Go: runtime.Version(), Sysctls: map[string]string{}}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		e.Kernel = unix.ByteSliceToString(u.Release[:]) + " " + unix.ByteSliceToString(u.Version[:])
	}
	e.Cmdline = readTrim("/proc/cmdline")
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				e.CPU = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	var si unix.Sysinfo_t
	if unix.Sysinfo(&si) == nil {
		e.MemoryMiB = int(uint64(si.Totalram) * uint64(si.Unit) >> 20)
	}
	if env, err := doctor.Gather(doctor.Options{RunDir: &netns.RunDir{Path: runDir}}); err == nil {
		if env.KernelConfig != nil {
			e.Config = map[string]string{}
			for _, k := range configKeys {
				if v, ok := env.KernelConfig[k]; ok {
					e.Config[k] = v
				}
			}
		}
		e.RunDirProp = env.RunDirState.Propagation
		if env.RunDirState.IsMountPoint {
			e.RunDirProp += " mount point"
		}
	}
	for k, p := range sysctlPaths {
		if v := readTrim(p); v != "" {
			e.Sysctls[k] = v
		}
	}
	if out, err := exec.Command("ip", "-V").Output(); err == nil {
		e.Iproute2 = strings.TrimSpace(string(out))
	}
	e.Nsfleet = version.String()
	return e
}

func readTrim(p string) string {
	b, err := os.ReadFile(p)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// KernelRelease is the kernel's release, the first word of Kernel.
func (e Env) KernelRelease() string {
	if i := strings.IndexByte(e.Kernel, ' '); i > 0 {
		return e.Kernel[:i]
	}
	return e.Kernel
}
