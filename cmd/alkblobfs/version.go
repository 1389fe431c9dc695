package main

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// versionString is the module version, the VCS revision (with "+dirty"
// for a modified tree) and the Go version, from the build information the
// Go toolchain records in the binary: what a bug report needs.
func versionString() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "alkblobfs (no build information)"
	}
	v := bi.Main.Version
	if v == "" {
		v = "(devel)"
	}
	var rev, when string
	dirty := false
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			rev = s.Value
		case "vcs.time":
			when = s.Value
		case "vcs.modified":
			dirty = s.Value == "true"
		}
	}
	var b strings.Builder
	fmt.Fprintf(&b, "alkblobfs %s", v)
	if len(rev) > 12 {
		rev = rev[:12]
	}
	if rev != "" && !strings.Contains(v, rev) { // a pseudo-version names it already
		fmt.Fprintf(&b, " (%s", rev)
		if dirty {
			b.WriteString("+dirty")
		}
		if when != "" {
			fmt.Fprintf(&b, ", %s", when)
		}
		b.WriteString(")")
	}
	fmt.Fprintf(&b, " %s", bi.GoVersion)
	return b.String()
}

func newVersionCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the version, the source revision and the Go version",
		Example: `  alkblobfs version`,
		Args:    argsRange(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintln(a.stdout, versionString())
			return nil
		},
	}
}
