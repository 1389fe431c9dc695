package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/store"
)

func newPutCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "put FILE|- [FILE...]",
		Short: "Store files and print their digests",
		Long: `put stores each FILE ("-" is standard input) and prints its digest, the
sha256 of its content, one per line in argument order. Content already in the
store is not written again. put stops at the first failure; the digests printed
before it were stored.`,
		Example: `  alkblobfs put app.tar
  alkblobfs put a.bin b.bin c.bin
  tar -c src | alkblobfs put -`,
		Args: argsRange(1, -1, "at least one FILE or -"),
		RunE: func(cmd *cobra.Command, args []string) error {
			stdin := 0
			for _, name := range args {
				if name == "-" {
					stdin++
				}
			}
			if stdin > 1 {
				return usagef(cmd, "put: standard input (-) given %d times", stdin)
			}
			st, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			for _, name := range args {
				d, err := a.putOne(cmd, st, name)
				if err != nil {
					return err
				}
				fmt.Fprintln(a.stdout, d)
			}
			return st.Close()
		},
	}
}

// putOne stores one file or standard input.
func (a *app) putOne(cmd *cobra.Command, st *store.Store, name string) (store.Digest, error) {
	label := name
	var in io.Reader
	size := int64(-1)
	if name == "-" {
		label = "<stdin>"
		in = a.stdin
		if f, ok := a.stdin.(*os.File); ok {
			size = regularRemaining(f)
		}
	} else {
		f, err := os.Open(name)
		if err != nil {
			return store.Digest{}, err
		}
		defer f.Close()
		in = f
		size = regularRemaining(f)
	}
	t := newTransfer(cmd.Context(), a.stderr, a.stderrTerm, size, "put "+filepath.Base(label))
	d, pin, err := st.Put(cmd.Context(), t.reader(in), size)
	t.done(err)
	if err != nil {
		if errors.Is(err, store.ErrTooLarge) && st.Large() == nil {
			return d, fmt.Errorf("%s: %w (this store has no large tier: --large none)", label, err)
		}
		return d, fmt.Errorf("%s: %w", label, err)
	}
	// The pin only guards the put against a concurrent sweep until this
	// returns; a blob stays because a namespace links it, not because of it.
	pin.Release()
	return d, nil
}

// regularRemaining is how many bytes are left to read from f when it is a
// regular file (the store then knows the size up front and can route the
// blob to its tier at once), else -1.
func regularRemaining(f *os.File) int64 {
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return -1
	}
	off, err := f.Seek(0, io.SeekCurrent)
	if err != nil || off > fi.Size() {
		return -1
	}
	return fi.Size() - off
}
