package fusefs

import (
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/alkblobfs/alkblobfs/upkeep/upkeeptest"
)

// TestControlGrammar runs the table every upkeep surface runs
// (upkeeptest) through the mounted control files, one write(2) at offset
// 0 each: what HTTP answers 200 to, the file takes; what HTTP answers 400
// to is EINVAL here and leaves the timer. A write elsewhere than offset
// 0 (a pwrite at 5) is no command: EINVAL, and the timer unchanged.
func TestControlGrammar(t *testing.T) {
	e := mountStore(t, memSpec)
	ctl := e.path(controlName)
	timer := ctl + "/sweep-timer"
	read := func() string { t.Helper(); return strings.TrimSuffix(readCtl(t, timer), "\n") }
	for _, c := range upkeeptest.Cases {
		if c.Input == "" {
			continue // no write(2) to send: an empty write is no command
		}
		if err := writeCtl(timer, upkeeptest.Before); err != nil {
			t.Fatal(err)
		}
		err := writeCtl(timer, c.Input)
		got := read()
		switch {
		case c.Timer == "":
			wantErrno(t, fmt.Sprintf("timer %q", c.Input), err, syscall.EINVAL)
			if got != upkeeptest.BeforeRead {
				t.Errorf("timer %q: refused, but the timer is now %s", c.Input, got)
			}
		case err != nil || got != c.Timer:
			t.Errorf("timer %q: %v, timer %s; want %s", c.Input, err, got, c.Timer)
		}
	}
	for _, name := range []string{"sweep", "scrub"} {
		for _, c := range upkeeptest.RunCases {
			err := writeCtl(ctl+"/"+name, c.Input)
			if c.OK && err != nil {
				t.Errorf("%s %q: %v", name, c.Input, err)
			}
			if !c.OK {
				wantErrno(t, fmt.Sprintf("%s %q", name, c.Input), err, syscall.EINVAL)
			}
		}
	}

	// A pwrite at offset 5 is no command, and spoils nothing: the same
	// open then takes one at offset 0.
	if err := writeCtl(timer, upkeeptest.Before); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(timer, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt([]byte("1h\n"), 5)
	wantErrno(t, "a pwrite of 1h at offset 5", err, syscall.EINVAL)
	if got := read(); got != upkeeptest.BeforeRead {
		t.Errorf("a pwrite at offset 5 set the timer to %s", got)
	}
	if _, err := f.WriteAt([]byte("3h\n"), 0); err != nil {
		t.Errorf("a command at offset 0 after a refused pwrite: %v", err)
	}
	f.Close()
	if got := read(); got != "3h0m0s" {
		t.Errorf("after 3h at offset 0: timer %s", got)
	}
	// >> (O_APPEND) writes at the end, which is 0: a command.
	sh(t, "echo 4h >> "+timer)
	if got := read(); got != "4h0m0s" {
		t.Errorf("after echo 4h >>: timer %s", got)
	}
	f, err = os.OpenFile(ctl+"/sweep", os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteAt([]byte("run"), 5)
	wantErrno(t, "a pwrite of run at offset 5 to sweep", err, syscall.EINVAL)
	f.Close()
}
