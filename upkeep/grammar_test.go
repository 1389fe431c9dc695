package upkeep

import (
	"testing"

	"github.com/alkblobfs/alkblobfs/upkeep/upkeeptest"
)

// TestGrammar runs the table every surface runs (upkeeptest) through the
// parser itself: Command and Sweeper.Set for a timer command, ParseEvery
// and the bounds for a flag, CheckRun for sweep and scrub.
func TestGrammar(t *testing.T) {
	u, err := New(Config{Store: &fakeStore{}})
	if err != nil {
		t.Fatal(err)
	}
	defer u.Stop()
	for _, c := range upkeeptest.Cases {
		if _, err := u.Sweeper.Set(upkeeptest.Before); err != nil {
			t.Fatal(err)
		}
		_, err := u.Sweeper.Set(Command([]byte(c.Input)))
		got := u.Sweeper.String()
		switch {
		case c.Timer == "" && err == nil:
			t.Errorf("timer %q: accepted (timer %s); want ErrBadInput", c.Input, got)
		case c.Timer == "" && got != upkeeptest.BeforeRead:
			t.Errorf("timer %q: refused but the timer is now %s", c.Input, got)
		case c.Timer != "" && (err != nil || got != c.Timer):
			t.Errorf("timer %q: %v, timer %s; want %s", c.Input, err, got, c.Timer)
		}

		d, err := ParseEvery(c.Input)
		if err == nil {
			err = CheckSweepEvery(d, false)
		}
		if err == nil {
			err = CheckScrub(d, 0)
		}
		switch {
		case c.Every == "" && err == nil:
			t.Errorf("flag %q: accepted as %s; want an error", c.Input, d)
		case c.Every != "" && (err != nil || d.String() != c.Every):
			t.Errorf("flag %q: %s, %v; want %s", c.Input, d, err, c.Every)
		}
	}
	for _, c := range upkeeptest.RunCases {
		if err := CheckRun(Command([]byte(c.Input))); (err == nil) != c.OK {
			t.Errorf("run command %q: %v; want ok=%v", c.Input, err, c.OK)
		}
	}
}
