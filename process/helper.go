package process

import (
	"errors"
	"github.com/nsfleet/nsfleet/internal/reexec"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"

	"golang.org/x/sys/unix"
)

// EtcNetnsDir is where iproute2 keeps per-namespace files bound over /etc.
var EtcNetnsDir = "/etc/netns"

// HelperMain is the MountNS helper: args are NAME -- CMD [ARGS...]. It runs
// in a process of its own, already in the network namespace and in a new
// mount namespace (see Command), sets up the mounts as `ip netns exec` does,
// and replaces itself with CMD. It returns only by exiting.
func init() { reexec.Register(HelperArg, HelperMain) }

func HelperMain(args []string) {
	if len(args) < 3 || args[1] != "--" {
		helperFail("helper: want NAME -- CMD [ARGS...]")
	}
	name, argv := args[0], args[2:]
	// Mounts made here must not propagate back to the host.
	if err := unix.Mount("", "/", "none", unix.MS_SLAVE|unix.MS_REC, ""); err != nil {
		helperFail("%s: make / a slave mount: %v", name, err)
	}
	// A /sys that shows the namespace's devices: sysfs takes the network
	// namespace of the task that mounts it, which here is the target.
	var flags uintptr
	var st unix.Statfs_t
	if unix.Statfs("/sys", &st) == nil && st.Flags&unix.ST_RDONLY != 0 {
		flags = unix.MS_RDONLY
	}
	unix.Unmount("/sys", unix.MNT_DETACH) // none there is fine
	if err := unix.Mount(name, "/sys", "sysfs", flags, ""); err != nil {
		helperFail("%s: mount sysfs: %v", name, err)
	}
	if err := bindEtc(name); err != nil {
		helperFail("%s: %v", name, err)
	}
	path, err := exec.LookPath(argv[0])
	if err != nil {
		helperFail("%s: %v", name, err)
	}
	err = syscall.Exec(path, argv, os.Environ())
	helperFail("%s: exec %s: %v", name, argv[0], err)
}

// bindEtc binds each entry of /etc/netns/NAME over the entry of the same
// name in /etc; entries without a counterpart in /etc are skipped, as
// iproute2 does.
func bindEtc(name string) error {
	dir := filepath.Join(EtcNetnsDir, name)
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		src := filepath.Join(dir, e.Name())
		dst := filepath.Join("/etc", e.Name())
		if err := unix.Mount(src, dst, "none", unix.MS_BIND, ""); err != nil {
			os.Stderr.WriteString("nsfleet exec: bind " + src + " -> " + dst + " failed: " + err.Error() + "\n")
		}
	}
	return nil
}
