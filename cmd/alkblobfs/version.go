package main

import (
	"fmt"
	"runtime/debug"
	"strings"

	"github.com/spf13/cobra"
)

// version is the release the binary was built from: make build sets it
// (-X main.version) to what scripts/version.sh derives from CHANGELOG.md's
// newest release, with +g<commit> after it. The version lives in the
// repository, not in tags, which a clone may lack; one script computes it
// for the binary, the man pages and the package alike.
var version string

// versionString is "alkblobfs", the version and the Go version: what a bug
// report needs.
func versionString() string {
	gov := "unknown"
	if bi, ok := debug.ReadBuildInfo(); ok {
		gov = bi.GoVersion
	}
	return "alkblobfs " + versionNumber() + " " + gov
}

// versionNumber is the version alone (the man pages' header). A plain go
// build, without the Makefile, has no version set: the build information
// the Go toolchain records then says what is true, the module version
// ("(devel)" from a checkout) and the VCS revision when it was stamped.
func versionNumber() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "(no build information)"
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
	b.WriteString(v)
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
	return b.String()
}

func newVersionCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:     "version",
		Short:   "Print the version and the Go version",
		Example: `  alkblobfs version`,
		Args:    argsRange(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			fmt.Fprintln(a.stdout, versionString())
			return nil
		},
	}
}
