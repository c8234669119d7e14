package lockfile

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

func TestAcquireRefusesASecondHolderAndNamesTheFirst(t *testing.T) {
	p := filepath.Join(t.TempDir(), "x.lock")
	l, err := Acquire(p, false)
	if err != nil {
		t.Fatal(err)
	}
	_, err = Acquire(p, false)
	var he *HeldError
	if !errors.Is(err, ErrHeld) || !errors.As(err, &he) || he.PID != fmt.Sprint(os.Getpid()) {
		t.Fatalf("second acquire: %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	l2, err := Acquire(p, false)
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	l2.Release()
	l2.Release() // twice is fine
}

func TestAcquireNeverFollowsASymlink(t *testing.T) {
	dir := t.TempDir()
	target := filepath.Join(dir, "target")
	os.WriteFile(target, []byte("keep"), 0o600)
	link := filepath.Join(dir, "x.lock")
	os.Symlink(target, link)
	if _, err := Acquire(link, false); err == nil {
		t.Fatal("acquired through a symlink")
	}
	if b, _ := os.ReadFile(target); string(b) != "keep" {
		t.Fatalf("target changed: %q", b)
	}
}
