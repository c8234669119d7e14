package process

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRotateLogKeepsNCopies(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "d.log")
	// The writer keeps its descriptor, as a daemon does.
	w, err := os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	for round := 1; round <= 4; round++ {
		w.WriteString(strings.Repeat(string(rune('a'+round)), 100))
		did, err := rotateLog(p, 50, 2)
		if err != nil || !did {
			t.Fatalf("round %d: rotated %v, %v", round, did, err)
		}
	}
	w.WriteString("tail")
	if did, _ := rotateLog(p, 50, 2); did {
		t.Fatal("rotated a log under the limit")
	}
	read := func(name string) string { b, _ := os.ReadFile(filepath.Join(dir, name)); return string(b) }
	if got := read("d.log"); got != "tail" {
		t.Errorf("log after truncation: %q, want the writer's next line at the start", got)
	}
	if got := read("d.log.1"); got != strings.Repeat("e", 100) {
		t.Errorf("d.log.1 = %q", got)
	}
	if got := read("d.log.2"); got != strings.Repeat("d", 100) {
		t.Errorf("d.log.2 = %q", got)
	}
	if _, err := os.Stat(filepath.Join(dir, "d.log.3")); err == nil {
		t.Error("kept more than 2 copies")
	}
}
