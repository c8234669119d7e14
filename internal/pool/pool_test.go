package pool

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestRunDoesEachIndexOnceWithBoundedWorkers(t *testing.T) {
	const n = 1000
	var seen [n]atomic.Int32
	var live, peak atomic.Int32
	opened := atomic.Int32{}
	err := Run(context.Background(), n, 4, func() (int, error) { return int(opened.Add(1)), nil }, nil, func(w, i int) {
		c := live.Add(1)
		for {
			p := peak.Load()
			if c <= p || peak.CompareAndSwap(p, c) {
				break
			}
		}
		seen[i].Add(1)
		live.Add(-1)
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range seen {
		if seen[i].Load() != 1 {
			t.Fatalf("index %d done %d times", i, seen[i].Load())
		}
	}
	if peak.Load() > 4 || opened.Load() > 4 {
		t.Fatalf("peak %d workers, %d opened; want at most 4", peak.Load(), opened.Load())
	}
}

func TestRunStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	var done atomic.Int32
	Each(ctx, 100, 1, func(i int) {
		if done.Add(1) == 10 {
			cancel()
		}
	})
	if done.Load() != 10 {
		t.Fatalf("%d done after cancel at 10", done.Load())
	}
}

func TestRunReportsOpenFailureOnlyWhenNoWorkerOpened(t *testing.T) {
	boom := errors.New("boom")
	err := Run(context.Background(), 5, 3, func() (int, error) { return 0, boom }, nil, func(int, int) {})
	if !errors.Is(err, boom) {
		t.Fatalf("err %v, want boom", err)
	}
	var k atomic.Int32
	var did atomic.Int32
	err = Run(context.Background(), 5, 3, func() (int, error) {
		if k.Add(1) > 1 {
			return 0, boom
		}
		return 1, nil
	}, nil, func(int, int) { did.Add(1) })
	if err != nil || did.Load() != 5 {
		t.Fatalf("err %v, did %d; want nil, 5 (one worker is enough)", err, did.Load())
	}
}

func TestFitFollowsTheLimit(t *testing.T) {
	if got := Fit(1000, 1); got < 1 || got > 1000 {
		t.Fatalf("Fit(1000, 1) = %d", got)
	}
	if got := Fit(1000, Limit()*2); got != 1 {
		t.Fatalf("Fit with workers larger than the limit = %d, want 1", got)
	}
	if got := Fit(3, 1); got != 3 && Limit()-Open() > 20 {
		t.Fatalf("Fit(3, 1) = %d, want 3", got)
	}
}

func TestRetryWaitsOutEMFILE(t *testing.T) {
	tries := 0
	err := Retry(func() error {
		tries++
		if tries < 4 {
			return unix.EMFILE
		}
		return nil
	})
	if err != nil || tries != 4 {
		t.Fatalf("err %v after %d tries", err, tries)
	}
	old := RetryFor
	RetryFor = 20 * time.Millisecond
	defer func() { RetryFor = old }()
	err = Retry(func() error { return unix.ENFILE })
	if !errors.Is(err, unix.ENFILE) {
		t.Fatalf("err %v, want ENFILE after the deadline", err)
	}
	other := errors.New("other")
	tries = 0
	if err := Retry(func() error { tries++; return other }); err != other || tries != 1 {
		t.Fatalf("a different error must not be retried: %v after %d", err, tries)
	}
}
