package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/store"
)

func newStatCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stat DIGEST",
		Short: "Show a blob's size and tier",
		Long: `stat prints the size of the blob DIGEST and the tier that holds it (kv or
large), from metadata: the content is not read.`,
		Example: `  alkblobfs stat 3f0a…e91c
  alkblobfs stat --json 3f0a…e91c | jq .size`,
		Args: argsRange(1, 1, "one DIGEST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := parseDigest(cmd, args[0])
			if err != nil {
				return err
			}
			st, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			info, ok, err := st.Stat(cmd.Context(), d)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("%s: %w", d, store.ErrMissing)
			}
			if asJSON {
				b, err := json.Marshal(info)
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "%s\n", b)
			} else {
				fmt.Fprintf(a.stdout, "digest  %s\nsize    %d (%s)\ntier    %s\n", info.Digest, info.Size, humanSize(info.Size), info.Tier)
			}
			return st.Close()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, `print {"digest","size","tier"} as JSON`)
	return cmd
}
