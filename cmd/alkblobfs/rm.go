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
	var force bool
	cmd := &cobra.Command{
		Use:         "rm DIGEST [DIGEST...]",
		Annotations: writes,
		Short:       "Delete blobs now",
		Long: `rm deletes each blob DIGEST from the store at once, without waiting for a
sweep. It refuses a blob that a namespace still links (exit status 1, naming
the namespaces): unlink it first. It also refuses a blob that any process
holds open or is putting (a mount beside it, another command), checked in the
same transaction as the delete. rm stops at the first failure.

A store that keeps no namespaces (--kv none, or a mem: kv tier beside a
durable large tier) cannot prove that nothing refers to a blob, so rm refuses
every blob there unless --force says that you know nothing does. --force
never overrides a blob held open or being put.`,
		Example: `  alkblobfs rm 3f0a…e91c
  alkblobfs ls | grep ^3f | xargs -r alkblobfs rm
  alkblobfs --kv none --large local:/srv/large rm --force 3f0a…e91c`,
		Args: argsRange(1, -1, "at least one DIGEST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ds, err := parseDigests(cmd, args)
			if err != nil {
				return err
			}
			st, svc, err := a.openNS(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			for _, d := range ds {
				del := st.Delete
				if force {
					del = st.ForceDelete
				}
				err := del(cmd.Context(), d)
				if errors.Is(err, store.ErrGcRefuse) && svc != nil {
					err = explainRefusal(cmd.Context(), svc, d, err)
				}
				if err != nil {
					return err
				}
			}
			return st.Close()
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "delete even where no liveness source can prove the blob unreferenced (stores without namespaces)")
	return cmd
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
	unlinks := make([]string, len(linkers))
	for i, n := range linkers {
		unlinks[i] = fmt.Sprintf("alkblobfs unlink %s %s", n, d)
	}
	if more {
		list += ", …"
		unlinks = append(unlinks, "…")
	}
	return fmt.Errorf("%w: linked in namespace %s; unlink it first: %s", refused, list, strings.Join(unlinks, " && "))
}
