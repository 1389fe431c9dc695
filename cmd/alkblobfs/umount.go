package main

import (
	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/fusefs"
)

func newUmountCmd(a *app) *cobra.Command {
	var force bool
	cmd := &cobra.Command{
		Use:   "umount [--force] MOUNTPOINT",
		Short: "Unmount a mount, also one whose daemon died or hangs",
		Long: `umount unmounts the filesystem at MOUNTPOINT; its daemon then exits. With
files open on it, it fails (exit 1) and changes nothing.

--force aborts the mount's FUSE connection first and then detaches it: for a
daemon that is stuck, stopped or killed, whose mount would otherwise make
every process that touches it wait forever. Files still open on it fail with
"transport endpoint is not connected". It needs root (fusectl).

A new 'alkblobfs mount' on a mountpoint whose daemon died does the same by
itself.`,
		Example: `  alkblobfs umount /mnt/blobs
  alkblobfs umount --force /mnt/blobs`,
		Args: argsRange(1, 1, "MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			return fusefs.Unmount(args[0], force)
		},
	}
	cmd.Flags().BoolVar(&force, "force", false, "abort the FUSE connection, then detach (for a dead or hung daemon)")
	return cmd
}
