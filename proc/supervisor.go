package proc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/spec"
	"golang.org/x/sys/unix"
)

// SuperviseOptions tune Supervise. The zero value means the defaults.
type SuperviseOptions struct {
	Tick       time.Duration // how often processes are checked; 0: 500 ms
	Backoff    time.Duration // first restart delay; 0: 1 s
	MaxBackoff time.Duration // 0: 60 s
	// A process that ran at least this long before it exited is restarted
	// after the first delay again; 0: 30 s.
	ResetAfter time.Duration
	Log        *slog.Logger
}

func (o *SuperviseOptions) defaults() {
	if o.Tick <= 0 {
		o.Tick = 500 * time.Millisecond
	}
	if o.Backoff <= 0 {
		o.Backoff = time.Second
	}
	if o.MaxBackoff <= 0 {
		o.MaxBackoff = time.Minute
	}
	if o.ResetAfter <= 0 {
		o.ResetAfter = 30 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
}

// ErrSupervised is returned when another supervisor holds the store.
var ErrSupervised = errors.New("another nsfleet supervise is running for this run dir")

// watched is what the supervisor knows of one process beyond its record.
type watched struct {
	cmd      *exec.Cmd  // set when this supervisor started it (its child)
	exited   chan error // receives cmd.Wait's result
	failures int        // consecutive quick exits, for the backoff
	next     time.Time  // not restarted before this
	done     bool       // exited and, by its policy, stays down
}

// Supervise keeps the fleet's processes running until ctx is cancelled. On
// start it adopts processes that are still running (from an earlier up or a
// supervisor that died) instead of starting duplicates. A process marked
// stopped (by down) is left alone. Processes keep running when
// the supervisor stops: they are not its to end.
func (s *Store) Supervise(ctx context.Context, f *spec.Fleet, rd *netns.RunDir, opts SuperviseOptions) error {
	opts.defaults()
	lock, err := s.lock()
	if err != nil {
		return err
	}
	defer lock.Close()
	state := map[string]*watched{}
	t := time.NewTicker(opts.Tick)
	defer t.Stop()
	for {
		s.pass(f, rd, state, &opts)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (s *Store) lock() (*os.File, error) {
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return nil, err
	}
	p := filepath.Join(s.Dir, "supervise.lock")
	lf, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(lf.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(p)
		lf.Close()
		return nil, fmt.Errorf("%w (pid %s)", ErrSupervised, strings.TrimSpace(string(holder)))
	}
	lf.Truncate(0)
	fmt.Fprintf(lf, "%d\n", os.Getpid())
	return lf, nil
}

// pass checks every process once and starts those that are due.
func (s *Store) pass(f *spec.Fleet, rd *netns.RunDir, state map[string]*watched, opts *SuperviseOptions) {
	now := time.Now()
	for i := range f.Namespaces {
		ns := &f.Namespaces[i]
		if len(ns.Processes) == 0 {
			continue
		}
		for _, p := range ns.Processes {
			key := ns.Name + "/" + p.Name
			w := state[key]
			if w == nil {
				w = &watched{}
				state[key] = w
			}
			rec, err := s.Load(ns.Name, p.Name)
			if err != nil {
				opts.Log.Warn("read record", "namespace", ns.Name, "process", p.Name, "err", err)
				continue
			}
			if rec != nil && rec.Stopped {
				continue // stopped by down or by hand: not ours to restart
			}
			if Alive(rec) {
				if w.cmd == nil && !w.done && w.exited == nil {
					opts.Log.Info("adopted", "namespace", ns.Name, "process", p.Name, "pid", rec.PID)
					w.exited = make(chan error) // never receives: not our child
				}
				continue
			}
			if w.done {
				continue
			}
			status := "exit status unknown (not our child)"
			failed := true
			if w.cmd != nil {
				select {
				case werr := <-w.exited:
					code, _ := ExitCode(werr)
					status, failed = fmt.Sprintf("exit %d", code), code != 0
					w.cmd = nil
				default:
					continue // dead per /proc, not reaped yet: next tick
				}
			}
			if rec != nil && w.next.IsZero() {
				// It just died (or was found dead): decide on a restart.
				ran := now.Sub(rec.Started)
				opts.Log.Info("exited", "namespace", ns.Name, "process", p.Name, "pid", rec.PID, "status", status, "ran", ran.Round(time.Millisecond))
				if p.Restart == spec.RestartNever || (p.Restart == spec.RestartOnFailure && !failed) {
					w.done = true
					continue
				}
				if ran >= opts.ResetAfter {
					w.failures = 0
				}
				delay := opts.Backoff << min(w.failures, 16)
				if delay > opts.MaxBackoff || delay <= 0 {
					delay = opts.MaxBackoff
				}
				w.failures++
				w.next = now.Add(delay)
				opts.Log.Info("restart scheduled", "namespace", ns.Name, "process", p.Name, "in", delay)
			}
			if now.Before(w.next) {
				continue
			}
			restarts := 0
			if rec != nil {
				restarts = rec.Restarts + 1
			}
			h, err := rd.Open(ns.Name)
			if err != nil {
				continue // namespace not there (yet, or any more)
			}
			nr, cmd, err := s.Launch(h, ns.Name, p, restarts)
			h.Close()
			if err != nil {
				opts.Log.Warn("start failed", "namespace", ns.Name, "process", p.Name, "err", err)
				w.next = now.Add(opts.Backoff << min(w.failures, 16))
				w.failures++
				continue
			}
			w.cmd, w.next = cmd, time.Time{}
			w.exited = make(chan error, 1)
			go func(c *exec.Cmd, ch chan error) { ch <- c.Wait() }(cmd, w.exited)
			opts.Log.Info("started", "namespace", ns.Name, "process", p.Name, "pid", nr.PID, "restarts", restarts, "log", s.LogPath(ns.Name, p.Name))
		}
	}
}
