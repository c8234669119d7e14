package bench

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nsfleet/nsfleet/netns"
	"golang.org/x/sys/unix"
)

// Execute runs a scenario with defaults filled in, in a run dir of its own
// under a prefix of its own, and returns the run with its environment. The
// run dir is removed afterwards, whatever happened.
func Execute(ctx context.Context, s *Scenario, o Options) (*Run, error) {
	var err error
	if o.Engines, err = pick(s.Engines, o.Engines); err != nil {
		return nil, fmt.Errorf("--engines: %w", err)
	}
	if o.Variants, err = pick(s.Variants, o.Variants); err != nil {
		return nil, fmt.Errorf("--variants: %w", err)
	}
	if o.N <= 0 {
		o.N = s.N
	}
	if o.Mark <= 0 {
		o.Mark = s.Mark
	}
	if o.Mark > o.N {
		o.Mark = o.N
	}
	if o.Runs <= 0 {
		o.Runs = 1
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Prefix == "" {
		o.Prefix = fmt.Sprintf("b%d-", os.Getpid()%100000)
	}
	if len(o.Prefix) > 7 {
		return nil, fmt.Errorf("prefix %q: at most 7 bytes, so that interface names fit in 15", o.Prefix)
	}
	if o.RunDir == "" {
		// Beside /run/netns, not in /tmp: a new pin is a new inode, and
		// ext4 looks for a free one in the parent directory's group; in a
		// group where many files were recently deleted (a busy /tmp) that
		// search is slow (find_inode_bit, recently_deleted: the native
		// engine's "pin" step ran at a third of ip's speed). The engines
		// that use /run/netns then pay the same as the native one.
		parent := filepath.Dir(netns.DefaultRunDir)
		if fi, err := os.Stat(parent); err != nil || !fi.IsDir() || unix.Access(parent, unix.W_OK) != nil {
			parent = ""
		}
		base, err := os.MkdirTemp(parent, "nsfleet-bench-")
		if err != nil {
			return nil, err
		}
		o.RunDir = filepath.Join(base, "netns")
		defer func() {
			for i := 0; i < 4 && unix.Unmount(o.RunDir, unix.MNT_DETACH) == nil; i++ {
			}
			os.RemoveAll(base)
		}()
	}
	run := &Run{
		ID:       NewID(),
		Scenario: s.Name,
		Started:  time.Now().UTC(),
		Keys:     s.Keys,
		Params: map[string]string{
			"n": strconv.Itoa(o.N), "mark": strconv.Itoa(o.Mark), "runs": strconv.Itoa(o.Runs),
			"engines": strings.Join(o.Engines, ","), "variants": strings.Join(o.Variants, ","),
			"workers": strconv.Itoa(o.Workers),
		},
	}
	err = s.Run(ctx, o, run)
	run.Elapsed = time.Since(run.Started).Seconds()
	run.Env = CaptureEnv(o.RunDir)
	if err != nil {
		return run, fmt.Errorf("bench %s: %w", s.Name, err)
	}
	return run, nil
}
