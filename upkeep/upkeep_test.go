package upkeep

import (
	"context"
	"errors"
	"iter"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/store"
)

// fakeStore counts sweeps and scrubs; each waits for hold to close (or
// its context to end) when hold is set.
type fakeStore struct {
	hold chan struct{}

	sweeps, scrubs atomic.Int64
	now, most      atomic.Int64 // sweeps or scrubs running, and the most at once
	results        []store.ScrubResult
}

func (f *fakeStore) enter() func() {
	n := f.now.Add(1)
	for {
		m := f.most.Load()
		if n <= m || f.most.CompareAndSwap(m, n) {
			break
		}
	}
	return func() { f.now.Add(-1) }
}

func (f *fakeStore) wait(ctx context.Context) error {
	if f.hold == nil {
		return nil
	}
	select {
	case <-f.hold:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (f *fakeStore) Sweep(ctx context.Context) (gc.Report, error) {
	defer f.enter()()
	f.sweeps.Add(1)
	return gc.Report{}, f.wait(ctx)
}

func (f *fakeStore) LastReport() (gc.Report, bool) { return gc.Report{}, false }

func (f *fakeStore) Digests(ctx context.Context) iter.Seq2[blob.Digest, error] {
	return func(func(blob.Digest, error) bool) {}
}

func (f *fakeStore) Scrub(ctx context.Context, _ iter.Seq2[blob.Digest, error], o store.ScrubOptions) (store.ScrubSummary, error) {
	defer f.enter()()
	f.scrubs.Add(1)
	var sum store.ScrubSummary
	for _, r := range f.results {
		sum.Checked++
		if err := o.Result(r); err != nil {
			return sum, err
		}
	}
	return sum, f.wait(ctx)
}

func newTest(t *testing.T, cfg Config) (*Upkeep, *fakeStore, *fusetest.Buffer) {
	t.Helper()
	fs, _ := cfg.Store.(*fakeStore)
	if fs == nil {
		fs = &fakeStore{}
		cfg.Store = fs
	}
	log := &fusetest.Buffer{}
	cfg.Logger = slog.New(slog.NewTextHandler(log, nil))
	u, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(u.Stop)
	return u, fs, log
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestSweepTimerFires(t *testing.T) {
	u, fs, _ := newTest(t, Config{SweepEvery: MinSweepInterval})
	if got := u.Sweeper.String(); got != "1s" {
		t.Fatalf("timer %q", got)
	}
	u.Start()
	eventually(t, "two timer sweeps", func() bool { return fs.sweeps.Load() >= 2 })
	u.Stop()
	n := fs.sweeps.Load()
	time.Sleep(1500 * time.Millisecond)
	if fs.sweeps.Load() != n || u.Sweeper.Runs() != n {
		t.Fatalf("sweeps after Stop: %d, then %d (Runs %d)", n, fs.sweeps.Load(), u.Sweeper.Runs())
	}
}

// TestSweepTimerCommands: off, on and durations, the default "on" resumes,
// and the undo of a command.
func TestSweepTimerCommands(t *testing.T) {
	u, _, _ := newTest(t, Config{})
	s := u.Sweeper
	set := func(cmd string) func() {
		t.Helper()
		undo, err := s.Set(cmd)
		if err != nil {
			t.Fatalf("Set(%q): %v", cmd, err)
		}
		return undo
	}
	if s.String() != "off" {
		t.Fatalf("starts %q", s)
	}
	set("on")
	if s.String() != DefaultSweepInterval.String() {
		t.Fatalf("on with no interval: %q", s)
	}
	set("90s")
	set("off")
	undo := set("on")
	if s.String() != "1m30s" {
		t.Fatalf("on resumes %q, want 1m30s", s)
	}
	undo()
	if s.String() != "off" {
		t.Fatalf("undo of on: %q, want off", s)
	}
	undo = set("2h")
	set("3h")
	undo() // the timer changed since: the undo leaves it
	if s.String() != "3h0m0s" {
		t.Fatalf("a stale undo changed the timer to %q", s)
	}
}

// TestSweepTimerBadInput: anything but off, on or a duration of at least
// MinSweepInterval is ErrBadInput and changes nothing.
func TestSweepTimerBadInput(t *testing.T) {
	u, _, _ := newTest(t, Config{SweepEvery: time.Hour})
	for _, bad := range []string{"0", "0s", "", "1ns", "999ms", "-1s", "ON", " on", "off\n", "banana", strings.Repeat("9", 100)} {
		_, err := u.Sweeper.Set(bad)
		if !errors.Is(err, ErrBadInput) {
			t.Errorf("Set(%q): %v, want ErrBadInput", bad, err)
		}
		if got := u.Sweeper.String(); got != "1h0m0s" {
			t.Fatalf("Set(%q) changed the timer to %q", bad, got)
		}
	}
	_, err := u.Sweeper.Set("5")
	if want := `invalid input: sweep-timer "5": want off, on or a duration of at least 1s such as 15m or 1h30m (unsigned, each unit once)`; err == nil || err.Error() != want {
		t.Fatalf("error %v, want %s", err, want)
	}
	_, err = u.Sweeper.Set(strings.Repeat("x", 100))
	if err == nil || !strings.Contains(err.Error(), strings.Repeat("x", 64)+"…\"") || strings.Contains(err.Error(), strings.Repeat("x", 65)) {
		t.Fatalf("long input not clipped: %v", err)
	}
}

// TestSweepOneAtATime: a Run waits for the sweep in progress.
func TestSweepOneAtATime(t *testing.T) {
	fs := &fakeStore{hold: make(chan struct{})}
	u, _, log := newTest(t, Config{Store: fs})
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() { u.Sweeper.Run(t.Context(), "test") })
	}
	eventually(t, "a sweep", func() bool { return fs.sweeps.Load() == 1 })
	time.Sleep(50 * time.Millisecond)
	close(fs.hold)
	wg.Wait()
	if fs.most.Load() != 1 || u.Sweeper.Runs() != 3 {
		t.Fatalf("%d at once, %d runs", fs.most.Load(), u.Sweeper.Runs())
	}
	if n := strings.Count(log.String(), `msg="sweep done" trigger=test`); n != 3 {
		t.Fatalf("%d sweep lines in the log:\n%s", n, log)
	}
}

// TestStopEndsTimerSweep: Stop ends a timer's sweep in progress and waits
// for it.
func TestStopEndsTimerSweep(t *testing.T) {
	fs := &fakeStore{hold: make(chan struct{})}
	u, _, log := newTest(t, Config{Store: fs, SweepEvery: MinSweepInterval})
	u.Start()
	eventually(t, "a timer sweep", func() bool { return fs.now.Load() == 1 })
	u.Stop()
	if fs.now.Load() != 0 {
		t.Fatal("Stop returned with a sweep running")
	}
	if !strings.Contains(log.String(), `msg="sweep failed" trigger=timer err="context canceled"`) {
		t.Fatalf("log:\n%s", log)
	}
}

// TestScrub: every verdict reaches the hook; the report and counters
// count the bad ones.
func TestScrub(t *testing.T) {
	d := func(b byte) blob.Digest { var d blob.Digest; d[0] = b; return d }
	fs := &fakeStore{results: []store.ScrubResult{
		{Digest: d(1), Status: store.ScrubOK},
		{Digest: d(2), Status: store.ScrubCorrupt, Error: "rot"},
		{Digest: d(3), Status: store.ScrubUnreadable, Error: "EIO"},
	}}
	var seen []store.ScrubResult
	u, _, log := newTest(t, Config{Store: fs, ScrubRate: 7, OnScrub: func(r store.ScrubResult) { seen = append(seen, r) }})
	if _, ok := u.Scrubber.LastReport(); ok {
		t.Fatal("a report before any scrub")
	}
	rep, err := u.Scrubber.Run(t.Context(), "test")
	if err != nil {
		t.Fatal(err)
	}
	last, ok := u.Scrubber.LastReport()
	if len(seen) != 3 || !ok || last.Trigger != "test" || len(rep.BadDigests) != 2 || rep.BadDigests[0] != d(2).String() ||
		u.Scrubber.Found() != 2 || u.Scrubber.Runs() != 1 || u.Scrubber.Rate() != 7 || rep.Checked != 3 {
		t.Fatalf("hook saw %d, report %+v, found %d, runs %d", len(seen), rep, u.Scrubber.Found(), u.Scrubber.Runs())
	}
	// With a hook, the corrupt blob is the hook's to log.
	if l := log.String(); strings.Contains(l, "blob is corrupt") || !strings.Contains(l, `msg="scrub: blob is unreadable"`) ||
		!strings.Contains(l, `msg="scrub done" trigger=test`) {
		t.Fatalf("log:\n%s", l)
	}

	u, _, log = newTest(t, Config{Store: fs})
	if _, err := u.Scrubber.Run(t.Context(), "test"); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(log.String(), `msg="scrub: blob is corrupt" digest=`+d(2).String()) {
		t.Fatalf("without a hook upkeep logs the corrupt blob:\n%s", log)
	}
}

// TestScrubOneAtATime: a second scrub waits for the first; one whose
// context ends while it waits leaves with its context's error.
func TestScrubOneAtATime(t *testing.T) {
	fs := &fakeStore{hold: make(chan struct{})}
	u, _, _ := newTest(t, Config{Store: fs})
	done := make(chan error, 2)
	go func() { _, err := u.Scrubber.Run(t.Context(), "a"); done <- err }()
	eventually(t, "a scrub", func() bool { return fs.scrubs.Load() == 1 })
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := u.Scrubber.Run(ctx, "b"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a waiting scrub whose context ended: %v", err)
	}
	go func() { _, err := u.Scrubber.Run(t.Context(), "c"); done <- err }()
	time.Sleep(50 * time.Millisecond)
	close(fs.hold)
	for range 2 {
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	if fs.most.Load() != 1 || fs.scrubs.Load() != 2 {
		t.Fatalf("%d at once, %d scrubs", fs.most.Load(), fs.scrubs.Load())
	}
}

// TestStopEndsScrub: Stop ends a scrub in progress (ErrStopped), ends the
// timer, and refuses scrubs after.
func TestStopEndsScrub(t *testing.T) {
	fs := &fakeStore{hold: make(chan struct{})}
	u, _, log := newTest(t, Config{Store: fs, ScrubEvery: MinScrubInterval})
	u.Start()
	done := make(chan error, 1)
	go func() { _, err := u.Scrubber.Run(t.Context(), "control file"); done <- err }()
	eventually(t, "a scrub", func() bool { return fs.now.Load() == 1 })
	u.Stop()
	if err := <-done; !errors.Is(err, ErrStopped) {
		t.Fatalf("a scrub running at Stop: %v, want ErrStopped", err)
	}
	if _, err := u.Scrubber.Run(t.Context(), "late"); !errors.Is(err, ErrStopped) {
		t.Fatalf("a scrub after Stop: %v", err)
	}
	if !strings.Contains(log.String(), `msg="scrub stopped early"`) {
		t.Fatalf("log:\n%s", log)
	}
	n := fs.scrubs.Load()
	time.Sleep(1500 * time.Millisecond)
	if fs.scrubs.Load() != n {
		t.Fatal("the timer scrubbed after Stop")
	}
}

func TestScrubTimerFires(t *testing.T) {
	u, fs, log := newTest(t, Config{ScrubEvery: MinScrubInterval})
	u.Start()
	eventually(t, "a timer scrub", func() bool { return fs.scrubs.Load() >= 1 })
	u.Stop()
	if !strings.Contains(log.String(), `msg="scrub started" trigger=timer`) {
		t.Fatalf("log:\n%s", log)
	}
}

func TestNewChecks(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string
	}{
		{Config{SweepEvery: time.Millisecond}, "at least 1s"},
		{Config{SweepEvery: -time.Second}, "at least 1s"},
		{Config{SweepEvery: time.Hour, ReadOnly: true}, "does not sweep"},
		{Config{ScrubEvery: 10 * time.Millisecond}, "at least 1s"},
		{Config{ScrubRate: -1}, "scrub rate -1"},
	} {
		c.cfg.Store = &fakeStore{}
		if _, err := New(c.cfg); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v, want %q", c.cfg, err, c.want)
		}
	}
	if _, err := New(Config{Store: &fakeStore{}, ReadOnly: true, ScrubEvery: time.Hour}); err != nil {
		t.Errorf("a read-only store scrubs: %v", err)
	}
	if _, err := New(Config{}); err == nil {
		t.Error("New without a store")
	}
}
