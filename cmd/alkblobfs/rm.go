package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

func newRmCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "rm DIGEST [DIGEST...]",
		Short: "Delete blobs now",
		Long: `rm deletes each blob DIGEST from the store at once, without waiting for a
sweep. It refuses a blob that a namespace still links (exit status 1, naming
the namespaces): unlink it first. Every DIGEST is checked before anything is
deleted; rm stops at the first failure.`,
		Example: `  alkblobfs rm 3f0a…e91c
  alkblobfs ls | grep ^3f | xargs -r alkblobfs rm`,
		Args: argsRange(1, -1, "at least one DIGEST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ds := make([]store.Digest, len(args))
			for i, s := range args {
				d, err := parseDigest(cmd, s)
				if err != nil {
					return err
				}
				ds[i] = d
			}
			st, svc, err := a.openNS(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			// A delete from outside a mount cannot see the blobs its open
			// files hold (lease.go).
			lease, err := a.holdLease(cmd.Context(), st, "while the store is mounted, rm NS/DIGEST on the mount drops a reference and its .alkblobfs/sweep collects")
			if err != nil {
				return fmt.Errorf("rm: %w", err)
			}
			defer lease.release()
			for _, d := range ds {
				err := st.Delete(cmd.Context(), d)
				if errors.Is(err, store.ErrGcRefuse) && svc != nil {
					err = explainRefusal(cmd.Context(), svc, d, err)
				}
				if err != nil {
					return err
				}
			}
			lease.release() // before Close: a PostgreSQL lease holds a pooled connection
			return st.Close()
		},
	}
}

// maxLinkers bounds how many linking namespaces a refusal names.
const maxLinkers = 5

// explainRefusal adds to a refused delete the namespaces that link d and
// how to unlink it. Finding them asks every namespace (Has): cheap next to
// a person reading the message.
func explainRefusal(ctx context.Context, svc *namespaces.Service, d store.Digest, refused error) error {
	var linkers []string
	more := false
	for name, err := range svc.Names(ctx, "") {
		if err != nil {
			return refused
		}
		_, ok, err := svc.Has(ctx, name, d)
		if err != nil || !ok {
			continue
		}
		if len(linkers) == maxLinkers {
			more = true
			break
		}
		linkers = append(linkers, name)
	}
	if len(linkers) == 0 {
		return refused
	}
	list := strings.Join(linkers, ", ")
	if more {
		list += ", …"
	}
	return fmt.Errorf("%w: linked in namespace %s; unlink it first: alkblobfs unlink %s %s", refused, list, linkers[0], d)
}
