// Package exitcode is how nsfleet's binaries end: the exit codes they
// share, the errors that carry a code through cobra, and Execute, which
// runs a command tree and turns what it returns into the process's code.
//
//	0    everything asked for was done
//	1    something failed or was left alone (the error says what)
//	2    the command line asks for something impossible (a usage error);
//	     doctor's own codes are documented with it
//	130  interrupted (SIGINT, SIGTERM): work in flight was finished
package exitcode

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
)

// The exit codes.
const (
	OK          = 0
	Failed      = 1
	Usage       = 2
	Interrupted = 130
)

// Error ends a command with Code. Err, if not nil, is printed first; with
// a nil Err the code says it all (exec passes its command's code on).
type Error struct {
	Code int
	Err  error
}

func (e *Error) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("exit status %d", e.Code)
	}
	return e.Err.Error()
}

func (e *Error) Unwrap() error { return e.Err }

// UsageError is a command line that cannot be run as given (code 2).
type UsageError struct{ Err error }

func (e UsageError) Error() string { return e.Err.Error() }
func (e UsageError) Unwrap() error { return e.Err }

// Of is the exit code for err, as Execute returns it; interrupted says
// whether the command's context was cancelled by a signal.
func Of(err error, interrupted bool) int {
	if err == nil {
		return OK
	}
	var ee *Error
	var u UsageError
	switch {
	case errors.As(err, &ee):
		return ee.Code
	case interrupted:
		return Interrupted
	case errors.As(err, &u) || strings.HasPrefix(err.Error(), "unknown command"):
		return Usage
	}
	return Failed
}

// Execute runs root with args (without the program name) and returns the
// exit code, having printed the error, if any, as "nsfleet: ERROR" on
// stderr. SIGINT and SIGTERM cancel the context the commands get; flag
// errors are usage errors.
func Execute(ctx context.Context, root *cobra.Command, args []string, stdout, stderr io.Writer) int {
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SilenceUsage, root.SilenceErrors = true, true
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return UsageError{err} })
	err := root.ExecuteContext(ctx)
	var ee *Error
	if err != nil && !(errors.As(err, &ee) && ee.Err == nil) {
		fmt.Fprintln(stderr, "nsfleet:", err)
	}
	return Of(err, ctx.Err() != nil)
}
