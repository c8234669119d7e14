package vm

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/klauspost/compress/zstd"
	"github.com/ulikunitz/xz"
)

// moduleSuffixes are the file names of kernel modules as distributions
// ship them: plain, or compressed with xz or zstd (Debian since 6.x).
var moduleSuffixes = []string{".ko", ".ko.xz", ".ko.zst"}

// moduleName is a module file's name without its suffix ("" if the file
// is not a module).
func moduleName(file string) string {
	for _, s := range moduleSuffixes {
		if strings.HasSuffix(file, s) {
			return strings.TrimSuffix(file, s)
		}
	}
	return ""
}

// readModule returns a module file's ELF image, decompressed where the
// file is compressed: the guest loads it with finit_module without
// asking the kernel to decompress (which needs CONFIG_MODULE_DECOMPRESS).
func readModule(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return decompressModule(path, b)
}

func decompressModule(path string, b []byte) ([]byte, error) {
	var r io.Reader
	switch {
	case strings.HasSuffix(path, ".xz"):
		xr, err := xz.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("%s: xz: %w", path, err)
		}
		r = xr
	case strings.HasSuffix(path, ".zst"):
		zr, err := zstd.NewReader(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("%s: zstd: %w", path, err)
		}
		defer zr.Close()
		r = zr
	default:
		return b, nil
	}
	out, err := io.ReadAll(io.LimitReader(r, 256<<20))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return out, nil
}
