package main

import (
	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/store"
)

func newRmCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "rm DIGEST [DIGEST...]",
		Short: "Delete blobs now",
		Long: `rm deletes each blob DIGEST from the store at once, without waiting for a
sweep. It refuses a blob that liveness protects (store.ErrGcRefuse). Every
DIGEST is checked before anything is deleted; rm stops at the first failure.`,
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
			st, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			for _, d := range ds {
				if err := st.Delete(cmd.Context(), d); err != nil {
					return err
				}
			}
			return st.Close()
		},
	}
}
