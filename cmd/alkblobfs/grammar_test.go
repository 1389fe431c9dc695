package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/upkeep/upkeeptest"
)

// TestUpkeepFlagsGrammar runs the table every upkeep surface runs
// (upkeeptest) through the timer flags of serve and mount: a value the
// table refuses is a usage error naming the flag, before anything is
// opened; one it takes passes, and the command goes on to the next check
// (a TCP listener without tokens for serve, --max-receipts 0 for mount),
// which fails on purpose. Before, the flags were pflag durations, which
// took "+5m", "5m5m" and "30m1h".
func TestUpkeepFlagsGrammar(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	for _, s := range []struct {
		flag  string
		args  func(v string) []string
		after string // the probe's error: the flag was taken
	}{
		{"--sweep-every", func(v string) []string { return []string{"serve", "--sweep-every=" + v, "--listen", "0.0.0.0:0"} }, "needs a token file"},
		{"--scrub-every", func(v string) []string { return []string{"serve", "--scrub-every=" + v, "--listen", "0.0.0.0:0"} }, "needs a token file"},
		{"--sweep-every", func(v string) []string {
			return []string{"mount", "--sweep-every=" + v, "--max-receipts", "0", t.TempDir()}
		}, "--max-receipts 0"},
	} {
		for _, tc := range upkeeptest.Cases {
			if strings.ContainsRune(tc.Input, 0) {
				continue // no argument carries a NUL
			}
			args := s.args(tc.Input)
			want := s.after
			if tc.Every == "" {
				want = s.flag
			}
			r := c.Run(nil, args...)
			if r.Code != 2 || !strings.Contains(r.Stderr, want) {
				t.Errorf("alkblobfs %s: exit %d, %s; want exit 2 and %q (the table says %s)", strings.Join(args, " "), r.Code,
					strings.TrimSpace(r.Stderr), want, map[bool]string{true: "refused", false: fmt.Sprint("taken as ", tc.Every)}[tc.Every == ""])
			}
		}
	}
}
