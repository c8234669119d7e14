package pool

import (
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// reserve is what Fit leaves free for everything that is not a worker: the
// Go runtime's poller, stdio, log files, a sentinel namespace or two.
const reserve = 6

// Limit returns the soft RLIMIT_NOFILE (Go raises it to the hard limit at
// start-up, so this is also the most the process may have).
func Limit() int {
	var rl unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &rl); err != nil || rl.Cur > 1<<20 {
		return 1 << 20
	}
	return int(rl.Cur)
}

// Open counts the descriptors the process has open now.
func Open() int {
	f, err := os.Open("/proc/self/fd")
	if err != nil {
		return 0
	}
	defer f.Close()
	names, _ := f.Readdirnames(-1)
	return len(names) - 1 // without the one reading the directory
}

// Fit returns how many workers, each holding at most perWorker descriptors
// at once, fit in what the limit leaves free now: at most want, at least 1
// (a single worker still progresses, thanks to Retry).
func Fit(want, perWorker int) int {
	if perWorker < 1 {
		perWorker = 1
	}
	free := Limit() - Open() - reserve
	return max(1, min(want, free/perWorker))
}

// IsExhausted reports whether err means that the process (EMFILE) or the
// system (ENFILE) is out of file descriptors.
func IsExhausted(err error) bool {
	return errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE)
}

// RetryFor bounds how long Retry waits for a descriptor to become free.
var RetryFor = 20 * time.Second

// Retry calls fn until it does not fail for lack of descriptors, waiting a
// little longer each time (another worker is about to close one), for at
// most RetryFor. It then returns the error, saying what the limit is.
func Retry(fn func() error) error {
	_, err := RetryValue(func() (struct{}, error) { return struct{}{}, fn() })
	return err
}

// RetryValue is Retry for a function that returns a value.
func RetryValue[T any](fn func() (T, error)) (T, error) {
	deadline := time.Now().Add(RetryFor)
	delay := 100 * time.Microsecond
	for {
		v, err := fn()
		if err == nil || !IsExhausted(err) {
			return v, err
		}
		if time.Now().After(deadline) {
			return v, fmt.Errorf("%w (open file limit %d, %d open; raise it with ulimit -n)", err, Limit(), Open())
		}
		time.Sleep(delay)
		delay = min(2*delay, 50*time.Millisecond)
	}
}
