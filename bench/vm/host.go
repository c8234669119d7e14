// Package vm runs a lab scenario on another kernel: it builds an
// initramfs itself (nsfleet, the tools the engines need and the kernel's
// modules, written as a cpio archive from Go; no disk image), boots the
// kernel under qemu (KVM where it can boot a standard kernel, TCG
// otherwise, and says which), runs the scenario in the guest with
// nsfleet as init, and brings the run back over a virtio serial port,
// never by reading the console.
package vm

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/bench"
)

// Options of one boot.
type Options struct {
	Kernel  string // bzImage
	Accel   string // auto, kvm or tcg
	CPUs    int
	Mem     string // qemu -m: 4G
	Modules string // the kernel's modules tree (holding lib/modules/RELEASE); "": /
	Cmdline string // extra kernel arguments
	Timeout time.Duration
	Self    string // the lab binary (nsfleet-lab) to run in the guest; "": this one
	Job     Job
	Log     func(format string, a ...any)
}

// Accel decides the accelerator: KVM only when it can boot a standard
// kernel (hardware VMX/SVM, not PVM's /dev/kvm), else TCG; with why.
func Accel(want string) (string, string) {
	switch want {
	case "kvm", "tcg":
		return want, "asked for"
	}
	if _, err := os.Stat("/dev/kvm"); err != nil {
		return "tcg", "no /dev/kvm"
	}
	if _, err := os.Stat("/sys/module/kvm_pvm"); err == nil {
		return "tcg", "/dev/kvm is PVM (kvm_pvm), which boots only PVM-guest kernels"
	}
	cpu, _ := os.ReadFile("/proc/cpuinfo")
	if !bytes.Contains(cpu, []byte(" vmx")) && !bytes.Contains(cpu, []byte(" svm")) {
		return "tcg", "the CPU shows no VMX or SVM"
	}
	return "kvm", "hardware virtualization"
}

// Boot runs o.Job on o.Kernel and returns the guest's run, with the
// kernel, accelerator and VM size in its parameters and notes.
func Boot(ctx context.Context, o Options) (*bench.Run, error) {
	if o.Log == nil {
		o.Log = func(string, ...any) {}
	}
	if o.CPUs <= 0 {
		o.CPUs = 2
	}
	if o.Mem == "" {
		o.Mem = "4G"
	}
	if o.Timeout <= 0 {
		o.Timeout = 10 * time.Minute
	}
	qemu, err := exec.LookPath("qemu-system-x86_64")
	if err != nil {
		return nil, errors.New("qemu-system-x86_64 not installed (Debian: apt-get install qemu-system-x86)")
	}
	release, err := KernelRelease(o.Kernel)
	if err != nil {
		return nil, err
	}
	accel, why := Accel(o.Accel)
	work, err := os.MkdirTemp("", "nsfleet-vm-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(work)
	initrd, missing, err := buildInitramfs(o, release)
	if err != nil {
		return nil, fmt.Errorf("%s: initramfs: %w", release, err)
	}
	o.Log("booting %s under %s (%s), %d CPUs, %s; initramfs %s", release, accel, why, o.CPUs, o.Mem, initrd)
	console, result := filepath.Join(work, "console.log"), filepath.Join(work, "result.json")
	cpu := "max"
	if accel == "kvm" {
		cpu = "host"
	}
	args := []string{"-accel", accel, "-cpu", cpu, "-smp", fmt.Sprint(o.CPUs), "-m", o.Mem,
		"-kernel", o.Kernel, "-initrd", initrd,
		"-append", strings.TrimSpace("console=ttyS0 panic=-1 rdinit=/init " + o.Cmdline),
		"-display", "none", "-no-reboot", "-nodefaults", "-serial", "file:" + console,
		"-device", "virtio-serial-pci", "-chardev", "file,id=res,path=" + result,
		"-device", "virtserialport,chardev=res,name=" + PortName}
	tctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	start := time.Now()
	out, err := exec.CommandContext(tctx, qemu, args...).CombinedOutput()
	took := time.Since(start)
	b, _ := os.ReadFile(result)
	var res Result
	if jerr := json.Unmarshal(bytes.TrimSpace(b), &res); jerr != nil || len(bytes.TrimSpace(b)) == 0 {
		why := "no result"
		switch {
		case tctx.Err() != nil:
			why = fmt.Sprintf("no result within %s (hung?)", o.Timeout)
		case err != nil:
			why = fmt.Sprintf("qemu: %v: %s", err, strings.TrimSpace(string(out)))
		}
		if len(missing) > 0 {
			why += fmt.Sprintf(" (modules not found for %s: %s; give --modules, the tree holding lib/modules/%s)", release, strings.Join(missing, ", "), release)
		}
		return nil, fmt.Errorf("%s: %s; last console lines:\n%s", release, why, tail(console, 15))
	}
	if res.Error != "" && res.Run == nil {
		if len(missing) > 0 {
			res.Error += fmt.Sprintf(" (modules not found for %s: %s)", release, strings.Join(missing, ", "))
		}
		return nil, fmt.Errorf("%s: %s; last console lines:\n%s", release, res.Error, tail(console, 10))
	}
	run := res.Run
	if run.Params == nil {
		run.Params = map[string]string{}
	}
	run.Params["kernel"] = res.Release
	run.Params["accel"] = accel
	run.Params["vm"] = fmt.Sprintf("%d CPUs, %s", o.CPUs, o.Mem)
	run.Params["kernel_image"] = o.Kernel
	if o.Cmdline != "" {
		run.Params["kernel_cmdline"] = o.Cmdline
	}
	note := fmt.Sprintf("run in a VM: kernel %s, %s, %d CPUs, %s, booted and run in %s", res.Release, accel, o.CPUs, o.Mem, took.Round(time.Millisecond))
	if accel == "tcg" {
		note += "; EMULATED (TCG: " + why + "): compare only with other runs under TCG"
	}
	run.Notes = append(run.Notes, note)
	if res.Error != "" {
		return run, fmt.Errorf("%s: %s", release, res.Error)
	}
	return run, nil
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return "  (no console output)"
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	var panicLine string
	for _, l := range lines {
		if strings.Contains(l, "Kernel panic") {
			panicLine = l // the cause, above the stack dump
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	if panicLine != "" && !strings.Contains(strings.Join(lines, "\n"), panicLine) {
		lines = append([]string{panicLine, "..."}, lines...)
	}
	return "  " + strings.Join(lines, "\n  ")
}

// buildInitramfs writes the guest's initramfs (cached by content under
// the user's cache directory) and returns its path and the modules it did
// not find.
func buildInitramfs(o Options, release string) (string, []string, error) {
	self := o.Self
	if self == "" {
		var err error
		if self, err = os.Executable(); err != nil {
			return "", nil, err
		}
	}
	var files []File
	dirs := map[string]bool{}
	addDirs := func(p string) {
		for d := filepath.Dir(p); d != "." && d != "/" && d != ""; d = filepath.Dir(d) {
			dirs[strings.TrimPrefix(d, "/")] = true
		}
	}
	copyIn := func(src, dst string) error {
		b, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		fi, err := os.Stat(src)
		if err != nil {
			return err
		}
		files = append(files, File{Name: strings.TrimPrefix(dst, "/"), Mode: uint32(fi.Mode().Perm()), Data: b})
		addDirs(dst)
		return nil
	}
	bins, _ := withLibraries(self)
	if err := copyIn(bins[0], "/usr/bin/nsfleet-lab"); err != nil {
		return "", nil, err
	}
	for _, lib := range bins[1:] {
		if err := copyIn(lib, lib); err != nil {
			return "", nil, err
		}
	}
	files = append(files, File{Name: "init", Link: "/usr/bin/nsfleet-lab"})
	// The engines' tools, when this machine has them.
	for _, tool := range []string{"ip", "unshare", "sysctl"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			continue
		}
		real, _ := filepath.EvalSymlinks(p)
		deps, _ := withLibraries(real)
		if err := copyIn(real, "/usr/sbin/"+tool); err != nil {
			return "", nil, err
		}
		for _, lib := range deps[1:] {
			if err := copyIn(lib, lib); err != nil {
				return "", nil, err
			}
		}
	}
	root := o.Modules
	if root == "" {
		root = "/"
	}
	want := []string{"virtio_pci", "virtio_console", "veth"}
	for _, v := range o.Job.Variants {
		if v == "dummy" {
			want = append(want, "dummy")
		}
	}
	mods, missing, err := moduleFiles(root, release, want)
	if err != nil {
		// Without a modules tree, a kernel with everything built in can
		// still run; the guest says what is missing.
		missing = want
	}
	job := o.Job
	job.Modules = nil
	for _, m := range mods {
		// Compressed modules go in as plain ELF (finit_module without
		// flags), under their plain name.
		b, err := readModule(m)
		if err != nil {
			return "", nil, err
		}
		dst := "/modules/" + moduleName(filepath.Base(m)) + ".ko"
		files = append(files, File{Name: strings.TrimPrefix(dst, "/"), Mode: 0o644, Data: b})
		addDirs(dst)
		job.Modules = append(job.Modules, dst)
	}
	// The kernel's config, where it lies beside the image (as Debian's
	// packages put it): the guest's environment capture reads the options
	// the reports blame from /boot/config-RELEASE.
	for _, c := range []string{filepath.Join(filepath.Dir(o.Kernel), "config-"+release), filepath.Join(root, "boot", "config-"+release)} {
		if _, err := os.Stat(c); err == nil {
			if err := copyIn(c, "/boot/config-"+release); err != nil {
				return "", nil, err
			}
			break
		}
	}
	jb, _ := json.Marshal(job)
	files = append(files, File{Name: strings.TrimPrefix(JobPath, "/"), Mode: 0o644, Data: jb})
	for _, d := range []string{"proc", "sys", "dev", "run", "tmp", "etc", "var/run"} {
		dirs[d] = true
	}
	for d := range dirs {
		files = append(files, File{Name: d, Mode: 0o755, Dir: true})
	}
	path, err := cacheInitramfs(files)
	return path, missing, err
}

// cacheInitramfs writes files as a gzipped cpio archive under the user's
// cache directory, named by its content, and returns its path (at once
// when that content is cached already).
func cacheInitramfs(files []File) (string, error) {
	var raw bytes.Buffer
	if err := writeCpio(&raw, files); err != nil {
		return "", err
	}
	sum := sha256.Sum256(raw.Bytes())
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	dir := filepath.Join(cache, "nsfleet", "initramfs")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, hex.EncodeToString(sum[:8])+".cpio.gz")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	var gz bytes.Buffer
	zw, _ := gzip.NewWriterLevel(&gz, gzip.BestSpeed)
	zw.Write(raw.Bytes())
	zw.Close()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, gz.Bytes(), 0o644); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}
