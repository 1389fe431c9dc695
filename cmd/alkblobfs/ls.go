package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

func newLsCmd(a *app) *cobra.Command {
	var long bool
	cmd := &cobra.Command{
		Use:   "ls [-l] [NAME]",
		Short: "List the blobs of the store or of a namespace",
		Long: `ls prints the digest of every blob in the store, one per line, in ascending
order. With NAME it lists only the blobs that namespace NAME links.

It streams: output starts at once and memory does not grow with the size of
the store or namespace.

With -l each digest is followed by its size in bytes; for a namespace, also
by the time it was first linked into NAME (RFC 3339, UTC).`,
		Example: `  alkblobfs ls
  alkblobfs ls -l | sort -k2 -n | tail
  alkblobfs ls builds
  alkblobfs ls -l builds`,
		Args: argsRange(0, 1, "no arguments or one NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 1 {
				if err := checkName(cmd, args[0]); err != nil {
					return err
				}
				st, svc, err := a.openNamespaces(cmd)
				if err != nil {
					return err
				}
				defer st.Close()
				if err := a.lsNamespace(cmd, st, svc, args[0], long); err != nil {
					return err
				}
				return st.Close()
			}
			st, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			w := bufio.NewWriter(a.stdout)
			for e, err := range st.List(cmd.Context()) {
				if err != nil {
					w.Flush()
					return err
				}
				if long {
					fmt.Fprintf(w, "%s %d\n", e.Digest, e.Size)
				} else {
					fmt.Fprintln(w, e.Digest)
				}
			}
			if err := w.Flush(); err != nil {
				return err
			}
			return st.Close()
		},
	}
	cmd.Flags().BoolVarP(&long, "long", "l", false, "print each digest with its size in bytes (and, for a namespace, when it was linked)")
	return cmd
}

// lsNamespace streams namespace name's references. -l costs one metadata
// lookup per reference; a reference to a blob the store no longer holds
// (which only a failure can produce) shows "-" as its size.
func (a *app) lsNamespace(cmd *cobra.Command, st *store.Store, svc *namespaces.Service, name string, long bool) error {
	ctx := cmd.Context()
	w := bufio.NewWriter(a.stdout)
	err := func() error {
		for ref, err := range svc.Entries(ctx, name, store.Digest{}) {
			if errors.Is(err, namespaces.ErrNotFound) {
				return noNamespace(name)
			}
			if err != nil {
				return err
			}
			if !long {
				fmt.Fprintln(w, ref.Digest)
				continue
			}
			if err := printRef(ctx, w, st, ref); err != nil {
				return err
			}
		}
		return nil
	}()
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	return err
}

func printRef(ctx context.Context, w io.Writer, st *store.Store, ref namespaces.Ref) error {
	size := "-"
	info, ok, err := st.Stat(ctx, ref.Digest)
	if err != nil {
		return err
	}
	if ok {
		size = fmt.Sprint(info.Size)
	}
	_, err = fmt.Fprintf(w, "%s %s %s\n", ref.Digest, size, ref.LinkedAt.UTC().Format(time.RFC3339))
	return err
}
