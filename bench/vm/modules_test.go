package vm

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// Compressed modules (Debian's newer kernels ship .ko.xz, others .ko.zst)
// are found by name through modules.dep and go into the guest as plain ELF.
func TestCompressedModules(t *testing.T) {
	elf := []byte("\x7fELF fake module image")
	var xzb, zstb bytes.Buffer
	xw, _ := xz.NewWriter(&xzb)
	xw.Write(elf)
	xw.Close()
	zw, _ := zstd.NewWriter(&zstb)
	zw.Write(elf)
	zw.Close()

	root := t.TempDir()
	base := filepath.Join(root, "lib", "modules", "6.12.0-1-amd64")
	os.MkdirAll(filepath.Join(base, "kernel", "drivers"), 0o755)
	os.WriteFile(filepath.Join(base, "kernel", "drivers", "veth.ko.xz"), xzb.Bytes(), 0o644)
	os.WriteFile(filepath.Join(base, "kernel", "drivers", "virtio_console.ko.zst"), zstb.Bytes(), 0o644)
	os.WriteFile(filepath.Join(base, "kernel", "drivers", "virtio.ko"), elf, 0o644)
	os.WriteFile(filepath.Join(base, "modules.dep"), []byte("kernel/drivers/veth.ko.xz:\nkernel/drivers/virtio_console.ko.zst: kernel/drivers/virtio.ko\nkernel/drivers/virtio.ko:\n"), 0o644)

	files, missing, err := moduleFiles(root, "6.12.0-1-amd64", []string{"virtio_console", "veth", "dummy"})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range files {
		names = append(names, filepath.Base(f))
		b, err := readModule(f)
		if err != nil || !bytes.Equal(b, elf) {
			t.Errorf("%s: %q %v, want the plain image", f, b, err)
		}
	}
	if !slices.Equal(names, []string{"virtio.ko", "virtio_console.ko.zst", "veth.ko.xz"}) || !slices.Equal(missing, []string{"dummy"}) {
		t.Errorf("files %v missing %v", names, missing)
	}
	if _, err := decompressModule("bad.ko.xz", []byte("not xz")); err == nil {
		t.Error("a corrupt .ko.xz read without error")
	}
}
