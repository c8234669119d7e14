package vm

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// KernelRelease reads the release ("6.1.0-47-cloud-amd64") from a bzImage:
// the setup header's kernel_version field points at a string that starts
// with it (Documentation/arch/x86/boot.rst).
func KernelRelease(image string) (string, error) {
	f, err := os.Open(image)
	if err != nil {
		return "", err
	}
	defer f.Close()
	hdr := make([]byte, 0x210)
	if _, err := f.ReadAt(hdr, 0); err != nil {
		return "", fmt.Errorf("%s: %w", image, err)
	}
	if string(hdr[0x202:0x206]) != "HdrS" {
		return "", fmt.Errorf("%s: not a bzImage (no HdrS boot header)", image)
	}
	off := int64(binary.LittleEndian.Uint16(hdr[0x20E:0x210])) + 0x200
	buf := make([]byte, 256)
	n, _ := f.ReadAt(buf, off)
	s := string(buf[:n])
	if i := strings.IndexAny(s, " \x00"); i > 0 {
		s = s[:i]
	}
	if s == "" {
		return "", fmt.Errorf("%s: no kernel version string", image)
	}
	return s, nil
}

// moduleFiles resolves names (veth, virtio_console) to module files in
// the modules tree of release under dir, dependencies first, from
// modules.dep. Names it does not find are returned in missing (they may
// be built in: the guest checks).
func moduleFiles(dir, release string, names []string) (files []string, missing []string, err error) {
	base := filepath.Join(dir, "lib", "modules", release)
	if _, err := os.Stat(base); err != nil {
		base = filepath.Join(dir, release)
	}
	if _, err := os.Stat(base); err != nil {
		return nil, nil, fmt.Errorf("modules of %s: %w (give --modules, the tree holding lib/modules/%s)", release, err, release)
	}
	dep, err := os.ReadFile(filepath.Join(base, "modules.dep"))
	if err != nil {
		// A package unpacked, not installed, has no modules.dep (depmod
		// writes it): read each module's own "depends=" instead.
		return modulesFromModinfo(base, names)
	}
	deps := map[string][]string{}
	byName := map[string]string{}
	sc := bufio.NewScanner(bytes.NewReader(dep))
	for sc.Scan() {
		line := sc.Text()
		i := strings.IndexByte(line, ':')
		if i < 0 {
			continue
		}
		mod := line[:i]
		deps[mod] = strings.Fields(line[i+1:])
		if name := moduleName(filepath.Base(mod)); name != "" {
			byName[strings.ReplaceAll(name, "-", "_")] = mod
		}
	}
	seen := map[string]bool{}
	var visit func(mod string)
	visit = func(mod string) {
		if seen[mod] {
			return
		}
		seen[mod] = true
		for _, d := range deps[mod] {
			visit(d)
		}
		files = append(files, filepath.Join(base, mod))
	}
	for _, n := range names {
		mod, ok := byName[strings.ReplaceAll(n, "-", "_")]
		if !ok {
			missing = append(missing, n)
			continue
		}
		visit(mod)
	}
	return files, missing, nil
}

// withLibraries returns path and the shared libraries it loads (from
// ldd), to copy into the guest at the same paths.
func withLibraries(path string) ([]string, error) {
	out := []string{path}
	res, err := exec.Command("ldd", path).Output()
	if err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) && strings.Contains(string(res)+string(ee.Stderr), "not a dynamic executable") {
			return out, nil // static
		}
		return out, nil
	}
	for _, line := range strings.Split(string(res), "\n") {
		for _, f := range strings.Fields(line) {
			if strings.HasPrefix(f, "/") {
				out = append(out, f)
			}
		}
	}
	return out, nil
}

// modulesFromModinfo resolves names by walking the modules tree and
// reading each module's .modinfo section (depends=a,b).
func modulesFromModinfo(base string, names []string) (files []string, missing []string, err error) {
	byName := map[string]string{}
	filepath.WalkDir(base, func(p string, d os.DirEntry, err error) error {
		if name := moduleName(d.Name()); err == nil && !d.IsDir() && name != "" {
			byName[strings.ReplaceAll(name, "-", "_")] = p
		}
		return nil
	})
	seen := map[string]bool{}
	var visit func(name string) bool
	visit = func(name string) bool {
		name = strings.ReplaceAll(name, "-", "_")
		p, ok := byName[name]
		if !ok {
			return false
		}
		if seen[name] {
			return true
		}
		seen[name] = true
		for _, d := range modinfoDepends(p) {
			visit(d)
		}
		files = append(files, p)
		return true
	}
	for _, n := range names {
		if !visit(n) {
			missing = append(missing, n)
		}
	}
	return files, missing, nil
}

// modinfoDepends reads "depends=" from a module's .modinfo section.
func modinfoDepends(path string) []string {
	b, err := readModule(path)
	if err != nil {
		return nil
	}
	f, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil
	}
	defer f.Close()
	sec := f.Section(".modinfo")
	if sec == nil {
		return nil
	}
	data, err := sec.Data()
	if err != nil {
		return nil
	}
	for _, kv := range bytes.Split(data, []byte{0}) {
		if v, ok := bytes.CutPrefix(kv, []byte("depends=")); ok {
			if len(v) == 0 {
				return nil
			}
			return strings.Split(string(v), ",")
		}
	}
	return nil
}
