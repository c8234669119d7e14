package process

import (
	"errors"
	"sync"

	"golang.org/x/sys/unix"
)

// exitWatch learns of process exits from pidfds: each watched process has a
// pidfd in one epoll set, and one goroutine waits on the set, so a thousand
// daemons cost a thousand descriptors and one thread, and no /proc polling.
// A pidfd refers to one process for its whole life, so a reused PID is
// never mistaken for the process watched.
type exitWatch struct {
	ep   int
	wake int // eventfd that stops the waiting goroutine
	C    chan int

	mu   sync.Mutex
	keys map[int]int // pidfd -> caller's key
	done chan struct{}
}

func newExitWatch() (*exitWatch, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return nil, err
	}
	wake, err := unix.Eventfd(0, unix.EFD_CLOEXEC|unix.EFD_NONBLOCK)
	if err != nil {
		unix.Close(ep)
		return nil, err
	}
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, wake, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(wake)}); err != nil {
		unix.Close(ep)
		unix.Close(wake)
		return nil, err
	}
	w := &exitWatch{ep: ep, wake: wake, C: make(chan int, 64), keys: map[int]int{}, done: make(chan struct{})}
	go w.run()
	return w, nil
}

// pidfdOpen opens a pidfd for pid; on failure the descriptor is -1.
func pidfdOpen(pid int) (int, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return -1, err
	}
	return fd, nil
}

// add watches pidfd (which the watch now owns): key is sent on C once the
// process has exited.
func (w *exitWatch) add(pidfd, key int) error {
	w.mu.Lock()
	w.keys[pidfd] = key
	w.mu.Unlock()
	ev := unix.EpollEvent{Events: unix.EPOLLIN | unix.EPOLLONESHOT, Fd: int32(pidfd)}
	if err := unix.EpollCtl(w.ep, unix.EPOLL_CTL_ADD, pidfd, &ev); err != nil {
		w.mu.Lock()
		delete(w.keys, pidfd)
		w.mu.Unlock()
		unix.Close(pidfd)
		return err
	}
	return nil
}

// remove stops watching pidfd and closes it.
func (w *exitWatch) remove(pidfd int) {
	if pidfd < 0 {
		return
	}
	unix.EpollCtl(w.ep, unix.EPOLL_CTL_DEL, pidfd, nil)
	w.mu.Lock()
	delete(w.keys, pidfd)
	w.mu.Unlock()
	unix.Close(pidfd)
}

// watching counts the pidfds held.
func (w *exitWatch) watching() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.keys)
}

func (w *exitWatch) run() {
	defer close(w.done)
	evs := make([]unix.EpollEvent, 64)
	for {
		n, err := unix.EpollWait(w.ep, evs, -1)
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return
		}
		for _, ev := range evs[:n] {
			fd := int(ev.Fd)
			if fd == w.wake {
				return
			}
			w.mu.Lock()
			key, ok := w.keys[fd]
			w.mu.Unlock()
			if ok {
				w.C <- key
			}
		}
	}
}

// close stops the goroutine and closes every descriptor. Nothing may be
// received from C afterwards.
func (w *exitWatch) close() {
	unix.Write(w.wake, []byte{1, 0, 0, 0, 0, 0, 0, 0})
	// The goroutine may be blocked sending on C: drain until it is gone.
	for {
		select {
		case <-w.C:
			continue
		case <-w.done:
		}
		break
	}
	w.mu.Lock()
	for fd := range w.keys {
		unix.Close(fd)
	}
	w.keys = nil
	w.mu.Unlock()
	unix.Close(w.ep)
	unix.Close(w.wake)
}
