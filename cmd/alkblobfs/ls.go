package main

import (
	"bufio"
	"fmt"

	"github.com/spf13/cobra"
)

func newLsCmd(a *app) *cobra.Command {
	var long bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List every blob's digest",
		Long: `ls prints the digest of every blob in the store, one per line, in ascending
order. It streams: output starts at once and memory does not grow with the
size of the store.`,
		Example: `  alkblobfs ls
  alkblobfs ls -l | sort -k2 -n | tail`,
		Args: argsRange(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
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
	cmd.Flags().BoolVarP(&long, "long", "l", false, "print each digest with its size in bytes")
	return cmd
}
