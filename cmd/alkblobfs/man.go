package main

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/cobra/doc"
)

// newManCmd is the hidden "man DIR" command behind make man: section 1
// pages for every command, from the commands themselves, and the section
// 8 page of the mount helper.
func newManCmd(root *cobra.Command) *cobra.Command {
	return &cobra.Command{
		Use:    "man DIR",
		Short:  "Write the man pages into DIR (make man)",
		Hidden: true,
		Args:   argsRange(1, 1, "DIR"),
		RunE: func(cmd *cobra.Command, args []string) error {
			dir := args[0]
			if err := os.MkdirAll(dir, 0o755); err != nil {
				return err
			}
			// A fixed date: the pages are reproducible from the source.
			date := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			if err := manTree(root, &doc.GenManHeader{Title: "ALKBLOBFS", Section: "1", Date: &date,
				Source: "alkblobfs " + versionNumber(), Manual: "alkblobfs manual"}, dir); err != nil {
				return err
			}
			return os.WriteFile(filepath.Join(dir, helperName+".8"), helperManPage(), 0o644)
		},
	}
}

// manTree is doc.GenManTree with each command's own --log-level default.
func manTree(cmd *cobra.Command, header *doc.GenManHeader, dir string) error {
	for _, c := range cmd.Commands() {
		if !c.IsAvailableCommand() || c.IsAdditionalHelpTopicCommand() {
			continue
		}
		if err := manTree(c, header, dir); err != nil {
			return err
		}
	}
	f, err := os.Create(filepath.Join(dir, strings.ReplaceAll(cmd.CommandPath(), " ", "-")+"."+header.Section))
	if err != nil {
		return err
	}
	defer f.Close()
	defer withLogDefault(cmd)()
	h := *header
	if err := doc.GenMan(cmd, &h, f); err != nil {
		return err
	}
	return f.Close()
}

// helperManPage is mount.fuse.alkblobfs(8), in roff.
func helperManPage() []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, `.TH MOUNT.FUSE.ALKBLOBFS 8 "Jan 2026" "alkblobfs %s" "System Administration"
.SH NAME
mount.fuse.alkblobfs \- mount an alkblobfs store from fstab or mount(8)
.SH SYNOPSIS
.B mount \-t fuse.alkblobfs
.I SOURCE MOUNTPOINT
.RB [ \-o
.IR OPTIONS ]
.br
.I SOURCE MOUNTPOINT
.B fuse.alkblobfs
.I OPTIONS
.B 0 0
(an /etc/fstab line)
.SH DESCRIPTION
mount(8) runs this helper for filesystems of type fuse.alkblobfs.
It runs
.B alkblobfs mount \-\-daemon
with the options below as flags, and returns once the mount serves, or
with a non-zero status and the reason if it could not.
An absolute
.I SOURCE
is the store's data directory; any other SOURCE (such as "alkblobfs")
leaves the store to the kv= and large= options.
The mount shows
.I SOURCE
as its source (/proc/mounts, findmnt(8), df(1)), a path resolved as
mount(8) resolves it, so that
.B mount \-a
finds the line mounted and leaves it alone.
umount(8) unmounts, and the daemon exits: by mountpoint, by a SOURCE that
is no path, or by a path SOURCE with
.BR \-c .
.SH OPTIONS
Each option is the alkblobfs flag of the same name, with _ for \-:
`, versionNumber())
	for _, k := range knownOptions() {
		fmt.Fprintf(&b, ".TP\n.B %s\n%s\n", strings.ReplaceAll(k, "_", "\\_"), strings.ReplaceAll(helperOptions[k], "-", "\\-"))
	}
	b.WriteString(`.PP
mount(8)'s own options (defaults, auto, noauto, nofail, _netdev, user, rw,
exec, suid, dev, atime and their opposites, x\-*) are accepted and ignored.
Any other option is an error, unless mount is run with \-s.
.SH EXAMPLE
.nf
/srv/blobs /mnt/blobs fuse.alkblobfs defaults,_netdev,verify=full,sweep_every=1h,allow_other 0 0
.fi
.SH SEE ALSO
alkblobfs(1), alkblobfs\-mount(1), fstab(5), mount(8)
`)
	return b.Bytes()
}
