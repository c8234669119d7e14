package vm

import (
	"fmt"
	"io"
	"sort"
)

// File is one entry of an initramfs.
type File struct {
	Name string // path inside, without a leading slash
	Mode uint32 // permission bits; the type comes from the fields below
	Data []byte // a regular file's contents
	Link string // a symlink's target
	Dir  bool
}

// writeCpio writes files as a "newc" cpio archive, the format the kernel
// unpacks as its initramfs: parents before children, then the trailer.
func writeCpio(w io.Writer, files []File) error {
	sort.SliceStable(files, func(i, j int) bool { return files[i].Name < files[j].Name })
	ino := uint32(1)
	for _, f := range files {
		mode := f.Mode & 0o7777
		var data []byte
		switch {
		case f.Dir:
			mode |= 0o040000
		case f.Link != "":
			mode |= 0o120000
			data = []byte(f.Link)
		default:
			mode |= 0o100000
			data = f.Data
		}
		nlink := uint32(1)
		if f.Dir {
			nlink = 2
		}
		if err := cpioEntry(w, ino, mode, nlink, f.Name, data); err != nil {
			return err
		}
		ino++
	}
	return cpioEntry(w, 0, 0, 1, "TRAILER!!!", nil)
}

func cpioEntry(w io.Writer, ino, mode, nlink uint32, name string, data []byte) error {
	// magic, ino, mode, uid, gid, nlink, mtime, filesize, devmajor,
	// devminor, rdevmajor, rdevminor, namesize, check
	hdr := fmt.Sprintf("070701%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X%08X",
		ino, mode, 0, 0, nlink, 0, len(data), 0, 0, 0, 0, len(name)+1, 0)
	buf := append([]byte(hdr), name...)
	buf = append(buf, 0)
	buf = pad4(buf)
	buf = append(buf, data...)
	buf = pad4(buf)
	_, err := w.Write(buf)
	return err
}

func pad4(b []byte) []byte {
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}
