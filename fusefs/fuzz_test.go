//go:build linux

package fusefs

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/upkeep"
)

// FuzzLookup looks names up through a real mount, at the root and in a
// namespace: only the names that exist resolve, everything else is ENOENT,
// ENAMETOOLONG or EINVAL, and no request panics (the harness fails the
// test on a panic in the log).
func FuzzLookup(f *testing.F) {
	e := mountStore(f, memSpec)
	e.mkns("ns")
	d := e.put("ns", []byte("fuzz")).String()
	for _, s := range []string{"", ".", "..", "ns", ".alkblobfs", "incoming", d, strings.ToUpper(d), d[:63], d + "0",
		strings.Repeat("a", 255), strings.Repeat("a", 256), "a\x01b", "é", "stats", "sweep"} {
		f.Add(s)
	}
	exists := map[string]bool{"": true, ".": true, "..": true, "ns": true, ".alkblobfs": true}
	existsNS := map[string]bool{"": true, ".": true, "..": true, incomingName: true, d: true}
	f.Fuzz(func(t *testing.T, name string) {
		if strings.ContainsAny(name, "/\x00") {
			return // not one name
		}
		check := func(dir string, want bool) {
			_, err := os.Lstat(filepath.Join(dir, name))
			switch {
			case want && err != nil:
				t.Fatalf("lstat %q in %s: %v, want it found", name, dir, err)
			case !want && err == nil:
				t.Fatalf("lstat %q in %s found something", name, dir)
			case err != nil && !errors.Is(err, syscall.ENOENT) && !errors.Is(err, syscall.ENAMETOOLONG) && !errors.Is(err, syscall.EINVAL):
				t.Fatalf("lstat %q in %s: %v", name, dir, err)
			}
		}
		check(e.mnt, exists[name])
		check(e.path("ns"), existsNS[name])
	})
}

// durationGrammar is the control files' duration grammar as the docs
// state it (mount.md), written apart from upkeep's parser: unsigned
// numbers, each unit once and in decreasing order.
var durationGrammar = regexp.MustCompile(`^(\d+(\.\d+)?h)?(\d+(\.\d+)?m)?(\d+(\.\d+)?s)?(\d+(\.\d+)?ms)?(\d+(\.\d+)?(us|µs))?(\d+(\.\d+)?ns)?$`)

// FuzzControl writes arbitrary input to the sweep timer's control file:
// it is accepted exactly when it is off, on, or a duration of the
// grammar of at least a second, with at most one trailing newline, and
// anything else is EINVAL and leaves the timer as it was.
func FuzzControl(f *testing.F) {
	e := mountStore(f, memSpec)
	timer := e.path(".alkblobfs", "sweep-timer")
	for _, s := range []string{"off", "on", "1s", "15m", "0", "0s", "1ns", "999ms", "-1s", "", " 2h\n", "2h\n", "2h\n\n", "1h\n2h", "run", "1e9", "9999999999h", "\xff", "0h1h", "1m30s", "5m5m", "+5m", "1.h", "1µs"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		if err := os.WriteFile(timer, []byte("off"), 0); err != nil {
			t.Fatal(err)
		}
		err := os.WriteFile(timer, []byte(in), 0)
		cmd := strings.TrimSuffix(in, "\n")
		d, perr := time.ParseDuration(cmd)
		want := cmd == "off" || cmd == "on" || durationGrammar.MatchString(cmd) && perr == nil && d >= upkeep.MinSweepInterval
		if in == "" {
			want = true // no write(2) at all
		}
		if (err == nil) != want {
			t.Fatalf("write %q: %v, want ok=%v", in, err, want)
		}
		if err != nil && !errors.Is(err, syscall.EINVAL) {
			t.Fatalf("write %q: %v, want EINVAL", in, err)
		}
		b, rerr := os.ReadFile(timer)
		if rerr != nil {
			t.Fatal(rerr)
		}
		if got := strings.TrimSpace(string(b)); err != nil && got != "off" {
			t.Fatalf("after the refused %q the timer reads %q, want off", in, got)
		}
	})
}
