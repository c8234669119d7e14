package progress

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestPlainLines(t *testing.T) {
	var out bytes.Buffer
	p := New(&out, "up", 10, "auto") // a buffer is not a terminal: plain
	p.Add(3)
	if out.Len() != 0 {
		t.Fatalf("a line before %v: %q", PlainEvery, out.String())
	}
	p.lastLine = time.Now().Add(-PlainEvery)
	p.start = time.Now().Add(-time.Second)
	p.Add(2)
	if got := out.String(); !strings.HasPrefix(got, "up: 5/10 (50%) ") || !strings.Contains(got, "eta ") {
		t.Fatalf("plain line = %q", got)
	}
	out.Reset()
	p.lastLine = time.Now().Add(-PlainEvery)
	p.Set(10, 10)
	if out.Len() != 0 {
		t.Fatalf("a progress line at the end: %q", out.String())
	}
	p.PrintAbove("up: bar-3: file exists")
	if out.String() != "up: bar-3: file exists\n" {
		t.Fatalf("PrintAbove = %q", out.String())
	}
	p.Finish()
}

func TestNothingShown(t *testing.T) {
	for _, c := range []struct {
		mode  string
		total int
	}{{"none", 100}, {"plain", 1}, {"bar", 0}} {
		var out bytes.Buffer
		p := New(&out, "down", c.total, c.mode)
		p.lastLine = time.Now().Add(-PlainEvery)
		p.Add(1)
		p.Finish()
		if out.Len() != 0 {
			t.Errorf("mode %s total %d wrote %q", c.mode, c.total, out.String())
		}
	}
}

func TestBarGrows(t *testing.T) {
	var out bytes.Buffer
	p := New(&out, "up", 2, "bar")
	p.Set(1, 2)
	p.Set(3, 5) // the total grows as work is discovered
	if p.done != 3 || p.total != 5 {
		t.Fatalf("done/total = %d/%d, want 3/5", p.done, p.total)
	}
	p.Finish()
	if !strings.Contains(out.String(), "up") {
		t.Fatalf("bar output %q has no description", out.String())
	}
}
