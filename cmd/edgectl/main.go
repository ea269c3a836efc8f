// Command edgectl runs and controls Edgeguard, the edge flood limiter.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"
)

// usageError marks errors in how the command was called (exit code 2).
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// exitError ends the command with a given exit code; err (if any) is
// printed. policy diff exits 1 for "there are changes" with nothing to
// print, as diff(1) does.
type exitError struct {
	code int
	err  error
}

func (e exitError) Error() string {
	if e.err == nil {
		return fmt.Sprintf("exit status %d", e.code)
	}
	return e.err.Error()
}
func (e exitError) Unwrap() error { return e.err }

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	os.Exit(execute(ctx, os.Args[1:]))
}

// execute runs the CLI and returns the process exit code: 0 ok, 1
// operational error, 2 usage or validation error.
func execute(ctx context.Context, args []string) int {
	return executeWith(ctx, newRootCommand(), args, nil, nil)
}

// executeWith runs cmd with args; in and out, when set, replace stdin and
// stdout+stderr (tests).
func executeWith(ctx context.Context, cmd *cobra.Command, args []string, in io.Reader, out io.Writer) int {
	cmd.SetArgs(args)
	if in != nil {
		cmd.SetIn(in)
	}
	if out != nil {
		cmd.SetOut(out)
		cmd.SetErr(out)
	}
	err := cmd.ExecuteContext(ctx)
	if err == nil {
		return 0
	}
	var ee exitError
	if errors.As(err, &ee) {
		if ee.err != nil {
			fmt.Fprintf(cmd.ErrOrStderr(), "edgectl: %v\n", ee.err)
		}
		return ee.code
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "edgectl: %v\n", err)
	var ue usageError
	if errors.As(err, &ue) || isCobraUsageError(err) {
		return 2
	}
	return 1
}
