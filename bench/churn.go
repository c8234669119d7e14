package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/nsfleet/nsfleet/internal/reexec"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// churn reproduces report 004 (docs/BACKGROUND.md): namespaces created and dropped in a
// tight loop, where freeing (which waits for RCU grace periods) can lag
// creation until unshare fails with ENOSPC. It runs in a user namespace of
// its own whose limit for the type is lowered (--limit, default 1,000), so
// the backlog shows as ENOSPC without touching the host's limits.
type churn struct{}

func init() {
	register(&Scenario{
		Name:     "churn",
		Describe: "report 004: unshare/drop namespaces in a loop; rate, ENOSPC stalls under a lowered limit, time to drain",
		N:        20000,
		Mark:     2000,
		Engines:  []string{"native"},
		Variants: []string{"ipc", "net", "uts"},
		Keys:     []string{"type"},
		Run:      churn{}.Run,
	})
}

// ChurnLimit is the per-type namespace limit set inside the user namespace.
var ChurnLimit = 1000

// ChurnHelperArg makes nsfleet (or a test binary) run as the churn helper.
const ChurnHelperArg = "__nsfleet-churn-helper"

var churnFlags = map[string]int{"ipc": unix.CLONE_NEWIPC, "net": unix.CLONE_NEWNET, "uts": unix.CLONE_NEWUTS}

type churnEvent struct {
	Mark    int     `json:"mark,omitempty"`
	Elapsed float64 `json:"elapsed,omitempty"` // seconds since start, at the mark
	ENOSPC  int     `json:"enospc,omitempty"`
	Stalled float64 `json:"stalled,omitempty"` // seconds spent waiting out ENOSPC
	Drain   float64 `json:"drain,omitempty"`   // seconds until the backlog was gone
	Err     string  `json:"err,omitempty"`
}

func (c churn) Run(ctx context.Context, o Options, run *Run) error {
	types := o.Variants
	run.Params["limit"] = strconv.Itoa(ChurnLimit)
	run.Notes = append(run.Notes, fmt.Sprintf("runs in a user namespace of its own with user.max_<type>_namespaces=%d; ENOSPC counts the times creation outran freeing by that many", ChurnLimit))
	for _, typ := range types {
		for rep := 0; rep < o.Runs; rep++ {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			cfg := map[string]string{"type": typ}
			o.Log.Info("run", "type", typ, "rep", rep+1)
			if err := c.once(ctx, o, cfg, rep, run); err != nil {
				return fmt.Errorf("type=%s: %w", typ, err)
			}
		}
	}
	return nil
}

func (c churn) once(ctx context.Context, o Options, cfg map[string]string, rep int, run *Run) error {
	cmd := exec.CommandContext(ctx, "/proc/self/exe", ChurnHelperArg, cfg["type"], strconv.Itoa(o.N), strconv.Itoa(o.Mark), strconv.Itoa(ChurnLimit))
	cmd.SysProcAttr = ownUserNamespace()
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start helper in a user namespace: %w", err)
	}
	sc := bufio.NewScanner(out)
	last := 0.0
	var helperErr error
	for sc.Scan() {
		var ev churnEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			continue
		}
		switch {
		case ev.Err != "":
			helperErr = errors.New(ev.Err)
		case ev.Mark > 0:
			run.Samples = append(run.Samples, Sample{Config: cfg, Mark: ev.Mark, Metric: "rate", Unit: "namespaces/s", Better: "higher", Rep: rep, Value: float64(o.Mark) / (ev.Elapsed - last)})
			last = ev.Elapsed
			if o.Progress != nil {
				o.Progress(ConfigKey(cfg, run.Keys), rep, ev.Mark, o.N)
			}
		default:
			run.Samples = append(run.Samples,
				Sample{Config: cfg, Metric: "ENOSPC stalls", Unit: "count", Better: "lower", Rep: rep, Value: float64(ev.ENOSPC)},
				Sample{Config: cfg, Metric: "time stalled on ENOSPC", Unit: "s", Better: "lower", Rep: rep, Value: ev.Stalled},
				Sample{Config: cfg, Metric: "time to drain", Unit: "s", Better: "lower", Rep: rep, Value: ev.Drain},
				Sample{Config: cfg, Metric: "overall rate", Unit: "namespaces/s", Better: "higher", Rep: rep, Value: float64(o.N) / max(last, 1e-9)})
		}
	}
	if err := cmd.Wait(); err != nil && helperErr == nil {
		helperErr = err
	}
	return helperErr
}

// ChurnHelperMain runs in the user namespace: args are TYPE N MARK LIMIT.
// It prints one JSON event per line and exits.
func init() { reexec.Register(ChurnHelperArg, ChurnHelperMain) }

func ChurnHelperMain(args []string) {
	emit := func(ev churnEvent) {
		b, _ := json.Marshal(ev)
		fmt.Println(string(b))
	}
	fail := func(err error) {
		emit(churnEvent{Err: err.Error()})
		os.Exit(1)
	}
	if len(args) != 4 {
		fail(errors.New("churn helper: want TYPE N MARK LIMIT"))
	}
	flag, ok := churnFlags[args[0]]
	n, err1 := strconv.Atoi(args[1])
	mark, err2 := strconv.Atoi(args[2])
	limit, err3 := strconv.Atoi(args[3])
	if !ok || errors.Join(err1, err2, err3) != nil || n <= 0 || mark <= 0 || limit < 2 {
		fail(fmt.Errorf("churn helper: bad arguments %q", args))
	}
	if err := os.WriteFile("/proc/sys/user/max_"+args[0]+"_namespaces", []byte(strconv.Itoa(limit)), 0); err != nil {
		fail(fmt.Errorf("lower the limit in the user namespace: %w", err))
	}
	// All the work on one locked thread, which is never handed back: each
	// unshare replaces the report's namespace and drops the previous one,
	// exactly like the report's loop. The process exits at the end.
	runtime.LockOSThread()
	start := time.Now()
	enospc := 0
	var stalled time.Duration
	for i := 1; i <= n; i++ {
		for {
			err := unix.Unshare(flag)
			if err == nil {
				break
			}
			if !errors.Is(err, unix.ENOSPC) {
				fail(fmt.Errorf("unshare %s: %w", args[0], err))
			}
			// Creation outran freeing by `limit` namespaces: wait.
			enospc++
			t := time.Now()
			time.Sleep(time.Millisecond)
			stalled += time.Since(t)
		}
		if i%mark == 0 {
			emit(churnEvent{Mark: i, Elapsed: time.Since(start).Seconds()})
		}
	}
	// Drop the last one, then time how long until limit-1 namespaces can be
	// held at once again: that is when the backlog has been freed.
	unix.Unshare(flag)
	drain, err := waitDrained(flag, limit-2, 60*time.Second)
	if err != nil {
		fail(err)
	}
	emit(churnEvent{ENOSPC: enospc, Stalled: stalled.Seconds(), Drain: drain.Seconds()})
	os.Exit(0)
}

// waitDrained creates namespaces and holds them (as fds) until it holds
// want at once: with the limit lowered, that is possible only once the
// backlog of dropped namespaces has been freed. It never lets one go before
// the end, so it adds no backlog of its own while it waits.
func waitDrained(flag, want int, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	typ := map[int]string{unix.CLONE_NEWIPC: "ipc", unix.CLONE_NEWNET: "net", unix.CLONE_NEWUTS: "uts"}[flag]
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	for len(fds) < want {
		if err := unix.Unshare(flag); err != nil {
			if !errors.Is(err, unix.ENOSPC) {
				return 0, err
			}
			if time.Since(start) > timeout {
				return 0, fmt.Errorf("backlog not drained after %v (held %d of %d)", timeout, len(fds), want)
			}
			time.Sleep(2 * time.Millisecond)
			continue
		}
		fd, err := unix.Open("/proc/thread-self/ns/"+typ, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return 0, err
		}
		fds = append(fds, fd)
	}
	return time.Since(start), nil
}
