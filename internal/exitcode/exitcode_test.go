package exitcode

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/spf13/cobra"
)

func TestOf(t *testing.T) {
	for _, c := range []struct {
		err         error
		interrupted bool
		want        int
	}{
		{nil, false, OK},
		{errors.New("up: bar-1: file exists"), false, Failed},
		{errors.New("up: interrupted"), true, Interrupted},
		{fmt.Errorf("wrapped: %w", UsageError{Err: errors.New("-f is required")}), false, Usage},
		{errors.New(`unknown command "upp" for "nsfleet"`), false, Usage},
		{&Error{Code: 3}, false, 3},                                // doctor's FAIL, exec's command
		{&Error{Code: Failed, Err: errors.New("x")}, true, Failed}, // the command's own word wins over the signal
	} {
		if got := Of(c.err, c.interrupted); got != c.want {
			t.Errorf("Of(%v, %v) = %d, want %d", c.err, c.interrupted, got, c.want)
		}
	}
}

func TestExecute(t *testing.T) {
	root := func(run func() error) *cobra.Command {
		r := &cobra.Command{Use: "nsfleet"}
		r.AddCommand(&cobra.Command{Use: "go", RunE: func(*cobra.Command, []string) error { return run() }})
		return r
	}
	for _, c := range []struct {
		args   []string
		err    error
		code   int
		stderr string
	}{
		{[]string{"go"}, nil, OK, ""},
		{[]string{"go", "--no-such-flag"}, nil, Usage, "nsfleet: unknown flag: --no-such-flag\n"},
		{[]string{"go"}, &Error{Code: 4}, 4, ""}, // the code alone: nothing printed
		{[]string{"go"}, errors.New("down: bar-2: busy"), Failed, "nsfleet: down: bar-2: busy\n"},
	} {
		var out, errb bytes.Buffer
		code := Execute(context.Background(), root(func() error { return c.err }), c.args, &out, &errb)
		if code != c.code || errb.String() != c.stderr {
			t.Errorf("%v: code %d, stderr %q; want %d, %q", c.args, code, errb.String(), c.code, c.stderr)
		}
	}
}
