// Command alkblobfs is the command-line front end of the alkblobfs blob
// store: put, get, cat, stat, ls, rm, ns, link, unlink, sweep and verify
// over a store opened from --kv/--large engine URLs (see README.md).
//
// main only parses, executes and maps the result to an exit code: 0 on
// success, 2 for usage errors (bad flags, wrong argument count, malformed
// digest or namespace name), 1 for everything else, with one line "alkblobfs: <error>" on
// stderr. No other file calls os.Exit.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/term"

	"github.com/alkblobfs/alkblobfs/fusefs"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

func main() {
	if strings.HasPrefix(filepath.Base(os.Args[0]), helperName) {
		os.Exit(runHelper(os.Args[1:]))
	}
	if os.Args[0] == fusefs.GuardName {
		os.Exit(fusefs.RunGuard(os.Args[1:]))
	}
	// The first SIGINT/SIGTERM cancels ctx so that in-flight work cleans up
	// (a put discards its stage, get -o removes its temp file); stop then
	// restores the default action, so a second signal kills at once.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	context.AfterFunc(ctx, stop)
	root := newRoot(&app{
		stdin:      os.Stdin,
		stdout:     os.Stdout,
		stderr:     os.Stderr,
		stderrTerm: term.IsTerminal(int(os.Stderr.Fd())),
	})
	err := root.ExecuteContext(ctx)
	interrupted := ctx.Err() != nil
	stop()
	if err != nil && interrupted && errors.Is(err, context.Canceled) {
		err = errors.New("interrupted")
	}
	os.Exit(exitCode(os.Stderr, err))
}

// exitCode prints err as one line and returns the process's exit status.
func exitCode(stderr io.Writer, err error) int {
	if err == nil {
		return 0
	}
	// One line, whatever the error: a joined error (e.g. from closing two
	// engines) would otherwise span several.
	msg := strings.ReplaceAll(strings.TrimSpace(err.Error()), "\n", "; ")
	fmt.Fprintf(stderr, "alkblobfs: %s\n", msg)
	var ue *usageError
	if errors.As(err, &ue) || errors.Is(err, store.ErrKeyInvalid) || errors.Is(err, namespaces.ErrBadName) {
		return 2
	}
	return 1
}
