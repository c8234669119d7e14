package process

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/nsfleet/nsfleet/internal/lockfile"
	"github.com/nsfleet/nsfleet/internal/pool"
	"github.com/nsfleet/nsfleet/netns"
	"github.com/nsfleet/nsfleet/spec"
	"golang.org/x/sys/unix"
)

// SuperviseOptions tune Supervise. The zero value means the defaults.
type SuperviseOptions struct {
	// Tick is how often due restarts, new namespaces, log sizes and the
	// processes watched without a pidfd are checked; 0: 500 ms. Exits of
	// processes with a pidfd are seen at once.
	Tick       time.Duration
	Backoff    time.Duration // first restart delay; 0: 1 s
	MaxBackoff time.Duration // 0: 60 s
	// A process that ran at least this long before it exited is restarted
	// after the first delay again; 0: 30 s.
	ResetAfter time.Duration
	Log        *slog.Logger
}

// ErrSupervised is returned when another supervisor holds the store.
var ErrSupervised = errors.New("another nsfleet supervise is running for this run dir")

// pidfdReserve is how many descriptors the supervisor leaves free for
// starting processes when it decides whether to watch one more by pidfd.
const pidfdReserve = 24

// watched is what the supervisor knows of one process beyond its record.
type watched struct {
	ns    *spec.Namespace
	p     spec.Process
	pid   int       // the live process watched; 0: none
	start time.Time // when it started (from its record)
	pidfd int       // -1: none (descriptor budget spent): the tick checks /proc
	child bool      // started by this supervisor: it reaps it and knows its status
	rec   *Record

	failures int
	next     time.Time        // earliest next start; zero: due now
	done     bool             // exited and, by its policy, stays down
	reaped   *unix.WaitStatus // status reaped by a check without pidfd
}

// supervisor is the state of one Supervise call.
type supervisor struct {
	s      *Store
	rd     *netns.RunDir
	policy Policy
	log    *slog.Logger
	exits  *exitWatch
	procs  []*watched
	budget int // pidfds that may still be opened
}

// Supervise keeps the fleet's processes running until ctx is cancelled. On
// start it adopts processes that are still running (from an earlier up or a
// supervisor that died) instead of starting duplicates. It learns of exits
// from pidfds (one epoll set, no polling); past the descriptor budget it
// falls back to checking /proc every tick. A process marked stopped (by
// down) is left alone. Logs are rotated by size. Processes keep running
// when the supervisor stops: they are not its to end.
func (s *Store) Supervise(ctx context.Context, f *spec.Fleet, rd *netns.RunDir, opts SuperviseOptions) error {
	if opts.Tick <= 0 {
		opts.Tick = 500 * time.Millisecond
	}
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	if err := os.MkdirAll(s.Dir, 0o700); err != nil {
		return err
	}
	lock, err := lockfile.Acquire(filepath.Join(s.Dir, "supervise.lock"), false)
	var held *lockfile.HeldError
	if errors.As(err, &held) {
		return fmt.Errorf("%w (pid %s)", ErrSupervised, held.PID)
	}
	if err != nil {
		return err
	}
	defer lock.Release()
	exits, err := newExitWatch()
	if err != nil {
		return fmt.Errorf("exit watch: %w", err)
	}
	defer exits.close()
	sv := &supervisor{s: s, rd: rd, exits: exits, log: opts.Log,
		policy: Policy{Backoff: opts.Backoff, MaxBackoff: opts.MaxBackoff, ResetAfter: opts.ResetAfter},
		budget: pool.Limit() - pool.Open() - pidfdReserve}
	for i := range f.Namespaces {
		ns := &f.Namespaces[i]
		for _, p := range ns.Processes {
			sv.procs = append(sv.procs, &watched{ns: ns, p: p, pidfd: -1})
		}
	}
	defer sv.release()
	t := time.NewTicker(opts.Tick)
	defer t.Stop()
	due := time.NewTimer(time.Hour)
	defer due.Stop()
	var lastRotate time.Time
	for {
		now := time.Now()
		sv.pass(now)
		if now.Sub(lastRotate) >= time.Second {
			sv.rotateLogs()
			lastRotate = now
		}
		// Wake for the earliest planned restart, not only on the tick.
		due.Reset(sv.nextDue(now, opts.Tick))
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-due.C:
		case k := <-exits.C:
			sv.exited(sv.procs[k], time.Now())
		}
	}
}

// nextDue is how long until the earliest planned start, at most limit.
func (sv *supervisor) nextDue(now time.Time, limit time.Duration) time.Duration {
	d := limit
	for _, w := range sv.procs {
		if w.pid == 0 && !w.done && !w.next.IsZero() {
			d = min(d, w.next.Sub(now))
		}
	}
	return max(d, time.Millisecond)
}

// release lets go of the children that are still running: they are not
// the supervisor's to end, and nobody will reap them but init.
func (sv *supervisor) release() {
	for _, w := range sv.procs {
		if w.pidfd >= 0 {
			sv.exits.remove(w.pidfd)
			w.pidfd = -1
		}
	}
}

// watch starts watching w's live process: by pidfd while the budget lasts.
func (sv *supervisor) watch(k int, w *watched) {
	w.pidfd = -1
	if sv.budget <= 0 {
		return
	}
	fd, err := pidfdOpen(w.pid)
	if err != nil {
		return // no pidfd support, or no descriptor left: the tick checks
	}
	if err := sv.exits.add(fd, k); err != nil {
		return
	}
	w.pidfd = fd
	sv.budget--
}

func (sv *supervisor) unwatch(w *watched) {
	if w.pidfd >= 0 {
		sv.exits.remove(w.pidfd)
		w.pidfd = -1
		sv.budget++
	}
}

// pass checks every process once: adopts running ones, notices exits of
// those watched without a pidfd, and starts those that are due.
func (sv *supervisor) pass(now time.Time) {
	for k, w := range sv.procs {
		if w.pid != 0 {
			if w.pidfd < 0 && !sv.alive(w) {
				sv.exited(w, now)
			}
			continue
		}
		if w.done {
			continue
		}
		rec, err := sv.s.Load(w.ns.Name, w.p.Name)
		if err != nil {
			sv.log.Warn("read record", "namespace", w.ns.Name, "process", w.p.Name, "err", err)
			continue
		}
		if rec != nil && (rec.Stopped || rec.Launching) {
			// Stopped by down or by hand: not ours to restart. Or being
			// launched right now by another (up, the agent's engine):
			// adopted once it runs.
			continue
		}
		if Alive(rec) {
			// Running, started by an earlier run or by up meanwhile.
			w.pid, w.start, w.child, w.rec, w.next = rec.PID, rec.Started, false, rec, time.Time{}
			sv.watch(k, w)
			// The PID could have been reused between the check and the
			// pidfd: check again now that the pidfd pins the process.
			if !Alive(rec) {
				sv.exited(w, now)
				continue
			}
			sv.log.Info("adopted", "namespace", w.ns.Name, "process", w.p.Name, "pid", rec.PID)
			continue
		}
		if rec != nil && w.next.IsZero() {
			// Found dead (it exited while nobody watched): decide as for
			// an exit whose status is unknown.
			w.rec, w.start = rec, rec.Started
			if !sv.decide(w, Exit{Ran: now.Sub(rec.Started)}, "exit status unknown (not our child)", now) {
				continue
			}
		}
		if now.Before(w.next) {
			continue
		}
		sv.launch(k, w, now, rec)
	}
}

// alive checks a process watched without a pidfd.
func (sv *supervisor) alive(w *watched) bool {
	if w.child {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(w.pid, &ws, unix.WNOHANG, nil)
		switch {
		case pid == w.pid:
			w.reaped = &ws // for exited to report
			return false
		case errors.Is(err, unix.ECHILD):
			w.child = false // reaped elsewhere: status unknown
			return false
		}
		return true
	}
	return Alive(w.rec)
}

// exited handles the end of w's process.
func (sv *supervisor) exited(w *watched, now time.Time) {
	if w.pid == 0 {
		return
	}
	sv.unwatch(w)
	e := Exit{Ran: now.Sub(w.start)}
	status := "exit status unknown (not our child)"
	ws := w.reaped
	if w.child && ws == nil {
		var st unix.WaitStatus
		if pid, err := unix.Wait4(w.pid, &st, 0, nil); pid == w.pid && err == nil {
			ws = &st
		}
	}
	if ws != nil {
		e.Known = true
		switch {
		case ws.Exited():
			status, e.Failed = fmt.Sprintf("exit %d", ws.ExitStatus()), ws.ExitStatus() != 0
		case ws.Signaled():
			status, e.Failed = "killed by "+unix.SignalName(ws.Signal()), true
		}
	}
	pid := w.pid
	w.pid, w.child, w.reaped = 0, false, nil
	sv.log.Info("exited", "namespace", w.ns.Name, "process", w.p.Name, "pid", pid, "status", status, "ran", e.Ran.Round(time.Millisecond))
	// A process stopped by down is not restarted.
	if rec, err := sv.s.Load(w.ns.Name, w.p.Name); err == nil && rec != nil && (rec.Stopped || rec.Launching) {
		// Stopped, or replaced by a launch in progress (a spec change):
		// the next pass adopts the new process.
		w.next = time.Time{}
		return
	}
	sv.decide(w, e, status, now)
}

// decide applies the restart policy; it reports whether a start is planned.
func (sv *supervisor) decide(w *watched, e Exit, status string, now time.Time) bool {
	d := sv.policy.AfterExit(w.p.Restart, w.failures, e)
	w.failures = d.Failures
	if !d.Restart {
		w.done = true
		return false
	}
	w.next = now.Add(d.Delay)
	sv.log.Info("restart scheduled", "namespace", w.ns.Name, "process", w.p.Name, "in", d.Delay)
	return true
}

// launch starts w's process inside its namespace.
func (sv *supervisor) launch(k int, w *watched, now time.Time, rec *Record) {
	restarts := 0
	if rec != nil {
		restarts = rec.Restarts + 1
	}
	h, err := sv.rd.Open(w.ns.Name)
	if err != nil {
		// Not there (yet, or any more): up makes it; try again later.
		w.next = now.Add(sv.policy.withDefaults().Backoff)
		return
	}
	nr, cmd, err := sv.s.Launch(h, w.ns.Name, w.p, restarts)
	h.Close()
	if err != nil {
		d := sv.policy.AfterStartFailure(w.failures)
		w.failures, w.next = d.Failures, now.Add(d.Delay)
		sv.log.Warn("start failed", "namespace", w.ns.Name, "process", w.p.Name, "err", err, "retry in", d.Delay)
		return
	}
	w.pid, w.start, w.child, w.rec, w.next = nr.PID, nr.Started, true, nr, time.Time{}
	sv.watch(k, w)
	// The supervisor reaps the child itself (wait4 once its pidfd says it
	// exited): Go's handle, a descriptor and a blocked thread per child,
	// is let go.
	cmd.Process.Release()
	sv.log.Info("started", "namespace", w.ns.Name, "process", w.p.Name, "pid", nr.PID, "restarts", restarts, "log", sv.s.LogPath(w.ns.Name, w.p.Name))
}

// rotateLogs keeps every process's log within its size.
func (sv *supervisor) rotateLogs() {
	for _, w := range sv.procs {
		max, keep := w.p.LogLimits()
		path := sv.s.LogPath(w.ns.Name, w.p.Name)
		if did, err := rotateLog(path, max, keep); err != nil {
			sv.log.Warn("log rotation", "namespace", w.ns.Name, "process", w.p.Name, "err", err)
		} else if did {
			sv.log.Debug("log rotated", "namespace", w.ns.Name, "process", w.p.Name, "log", path)
		}
	}
}
