package process

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
)

// rotateLog keeps a process's log under max bytes, as logrotate's
// copytruncate does: the process holds its log open with O_APPEND and
// cannot be asked to reopen it, so past max the log is copied to NAME.1
// (older copies shift to NAME.2 ... NAME.keep, the oldest is dropped) and
// then truncated; the process's next write lands at the start. Lines
// written between the copy and the truncation are lost (at most one tick's
// worth). It reports whether it rotated.
func rotateLog(path string, max int64, keep int) (bool, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fi.Size() <= max {
		return false, nil
	}
	os.Remove(path + "." + strconv.Itoa(keep))
	for i := keep - 1; i >= 1; i-- {
		os.Rename(path+"."+strconv.Itoa(i), path+"."+strconv.Itoa(i+1))
	}
	src, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer src.Close()
	dst, err := os.OpenFile(path+".1", os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return false, err
	}
	_, cerr := io.Copy(dst, src)
	if err := dst.Close(); cerr == nil {
		cerr = err
	}
	if cerr != nil {
		// Full disk: keep the log as it is rather than lose it; the
		// truncation still frees the space the process needs.
		os.Remove(path + ".1")
		return false, fmt.Errorf("rotate %s: %w", path, cerr)
	}
	if err := os.Truncate(path, 0); err != nil {
		return false, fmt.Errorf("rotate %s: %w", path, err)
	}
	return true, nil
}
