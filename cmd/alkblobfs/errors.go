package main

import (
	"fmt"

	"github.com/spf13/cobra"
)

// usageError marks a mistake in how alkblobfs was invoked (exit status 2),
// as opposed to a failure while doing the work (exit status 1).
type usageError struct {
	err  error
	help string // command path for the --help hint, "" for none
}

func (e *usageError) Error() string {
	if e.help == "" {
		return e.err.Error()
	}
	return fmt.Sprintf("%v (see '%s --help')", e.err, e.help)
}

func (e *usageError) Unwrap() error { return e.err }

// usage wraps err as a usage error of cmd.
func usage(cmd *cobra.Command, err error) error {
	return &usageError{err: err, help: cmd.CommandPath()}
}

func usagef(cmd *cobra.Command, format string, a ...any) error {
	return usage(cmd, fmt.Errorf(format, a...))
}

// argsRange is cobra.RangeArgs with a usage error that names the
// arguments expected; max < 0 means no upper bound.
func argsRange(min, max int, want string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) < min || max >= 0 && len(args) > max {
			return usagef(cmd, "%s: want %s, got %d argument%s", cmd.Name(), want, len(args), plural(len(args)))
		}
		return nil
	}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}
