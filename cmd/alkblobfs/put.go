package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

func newPutCmd(a *app) *cobra.Command {
	var ns string
	cmd := &cobra.Command{
		Use:         "put [--ns NAME] FILE|- [FILE...]",
		Annotations: writesRemote,
		Short:       "Store files and print their digests",
		Long: `put stores each FILE ("-" is standard input) and prints its digest, the
sha256 of its content, one per line in argument order. Content already in the
store is not written again. put stops at the first failure; the digests printed
before it were stored.

With --ns NAME each blob is also linked into namespace NAME as it is
published (for kv-tier blobs in the same database transaction), so sweeps
keep it. NAME must exist (alkblobfs ns create NAME); an absent NAME fails
before any file is read. A blob that would take NAME over its quota (ns quota)
is not linked: put stops there with exit status 1, naming the namespace, its
limit and what it holds.

With --remote URL the files go to that alkblobfs server (serve, or mount
--listen) over HTTP; --ns is then required.

Without --ns nothing references the blobs once put exits: the next sweeps
collect them (the first stages them, the next deletes them; on a store
without a durable window, one sweep does both). Use --ns, or link them
later with "alkblobfs link NAME DIGEST", to keep them.`,
		Example: `  alkblobfs put --ns builds app.tar
  alkblobfs put --ns builds a.bin b.bin c.bin
  tar -c src | alkblobfs put --ns builds -
  alkblobfs put scratch.bin            # unreferenced: gone after the next sweeps`,
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
			nsSet := cmd.Flags().Changed("ns")
			if nsSet {
				if err := checkName(cmd, ns); err != nil {
					return err
				}
			}
			if a.remote != "" {
				return a.remotePut(cmd, args, ns)
			}
			var st *store.Store
			var opts []store.PutOption
			var quotaNS string
			var quotaSvc *namespaces.Service
			if nsSet {
				s, svc, err := a.openNamespaces(cmd)
				if err != nil {
					return err
				}
				st = s
				defer st.Close()
				if err := mustExist(cmd.Context(), svc, ns); err != nil {
					return err
				}
				// putOne releases each put's pin as it returns: the
				// link keeps the blob (store.ReleasesPinAtOnce).
				part, err := svc.LinkRows(ns)
				if err != nil {
					return err
				}
				opts = append(opts, store.WithLink(svc, part), store.ReleasesPinAtOnce())
				quotaNS, quotaSvc = ns, svc
			} else {
				s, err := a.open(cmd)
				if err != nil {
					return err
				}
				st = s
				defer st.Close()
			}
			for _, name := range args {
				d, err := a.putOne(cmd, st, name, opts...)
				if err != nil && quotaSvc != nil {
					return quotaRefused(cmd.Context(), quotaSvc, quotaNS, "put "+name, err)
				}
				if err != nil {
					return err
				}
				fmt.Fprintln(a.stdout, d)
			}
			return st.Close()
		},
	}
	cmd.Flags().StringVar(&ns, "ns", "", "link each blob into namespace `NAME` as it is published")
	return cmd
}

// putOne stores one file or standard input.
func (a *app) putOne(cmd *cobra.Command, st *store.Store, name string, opts ...store.PutOption) (store.Digest, error) {
	label, in, size, closeIn, err := a.input(name)
	if err != nil {
		return store.Digest{}, err
	}
	defer closeIn()
	t := newTransfer(cmd.Context(), a.stderr, a.stderrTerm, size, "put "+filepath.Base(label))
	d, pin, err := st.Put(cmd.Context(), t.reader(in), size, opts...)
	t.done(err)
	if err != nil {
		if errors.Is(err, store.ErrTooLarge) && (st.Mode() == store.ModeKVOnly || st.Mode() == store.ModeMemOnly) {
			return d, fmt.Errorf("%s: %w (this store has no large tier: --large none)", label, err)
		}
		return d, fmt.Errorf("%s: %w", label, err)
	}
	// The pin only guards the put against a concurrent sweep until this
	// returns; a blob stays because a namespace links it (--ns), not
	// because of the pin.
	pin.Release()
	return d, nil
}

// input opens a put's FILE argument ("-" is standard input): its label
// for messages, its content, its size when known (else -1), and what
// closes it.
func (a *app) input(name string) (label string, in io.Reader, size int64, closeIn func(), err error) {
	if name == "-" {
		size = -1
		if f, ok := a.stdin.(*os.File); ok {
			size = regularRemaining(f)
		}
		return "<stdin>", a.stdin, size, func() {}, nil
	}
	f, err := os.Open(name)
	if err != nil {
		return "", nil, 0, nil, err
	}
	return name, f, regularRemaining(f), func() { f.Close() }, nil
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
