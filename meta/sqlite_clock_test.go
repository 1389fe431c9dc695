package meta_test

import (
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/meta"
)

// fakeBoot is a boot clock a test moves by hand.
type fakeBoot struct{ ns atomic.Int64 }

func (b *fakeBoot) now() int64              { return b.ns.Load() }
func (b *fakeBoot) advance(d time.Duration) { b.ns.Add(int64(d)) }

func openOnBoot(t *testing.T, path, id string, b *fakeBoot, wall time.Time) *sqliteState {
	t.Helper()
	return openSQLiteState(t, path, meta.Boot{
		ID:    func() (string, error) { return id, nil },
		Nanos: func() (int64, error) { return b.now(), nil },
		Wall:  func() int64 { return wall.UnixNano() },
	})
}

// TestRowClockIgnoresTheWallClock: processes of one boot share the row
// clock whatever their wall clocks say — the second opener's wall clock,
// an hour ahead (a settimeofday between the two), moves no row time — and
// the row clock is the boot clock: it moves with it and only with it.
func TestRowClockIgnoresTheWallClock(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	b := &fakeBoot{}
	b.advance(time.Hour)
	wall := time.Unix(1_800_000_000, 0)
	first := openOnBoot(t, path, "boot-1", b, wall)
	second := openOnBoot(t, path, "boot-1", b, wall.Add(time.Hour))
	if got, want := first.RowNow(), wall.UnixNano(); got != want {
		t.Fatalf("row clock of the boot's first opener = %d; want its wall clock, %d", got, want)
	}
	if a, c := first.RowNow(), second.RowNow(); a != c {
		t.Fatalf("two processes of one boot disagree on the row clock: %d and %d", a, c)
	}
	d := blob.Sum([]byte("pinned"))
	if err := first.PinRows(t.Context(), "A", []blob.Digest{d}, time.Minute); err != nil {
		t.Fatal(err)
	}
	b.advance(59 * time.Second)
	if n, err := second.PinCount(t.Context()); n != 1 || err != nil {
		t.Fatalf("PinCount 59 s into a 60 s TTL on the boot clock = %d, %v; want the row", n, err)
	}
	b.advance(time.Second)
	if n, err := second.PinCount(t.Context()); n != 0 || err != nil {
		t.Fatalf("PinCount at the TTL on the boot clock = %d, %v; want none", n, err)
	}
}

// TestRowClockOnReboot: a database opened under a new boot id forgets the
// pin rows of the old boot (their owners died with it), lapses its
// namespace intents, and moves each window row to now plus what was left
// of its delay when the old boot last staged a row — so none waits longer
// than its window. The new epoch comes from the wall clock once.
func TestRowClockOnReboot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	ctx := t.Context()
	old := &fakeBoot{}
	old.advance(30 * 24 * time.Hour) // a month of uptime
	wall := time.Unix(1_800_000_000, 0)
	e := openOnBoot(t, path, "boot-1", old, wall)
	if _, err := e.DB().ExecContext(ctx, `CREATE TABLE ns_pending (id INTEGER PRIMARY KEY, ns TEXT NOT NULL,
		digest BLOB NOT NULL, holder TEXT NOT NULL, expiry INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}
	if _, err := e.DB().ExecContext(ctx, `INSERT INTO ns_pending VALUES (1, 'ns', x'00', 'mount', ?)`,
		e.RowNow()+int64(time.Hour)); err != nil {
		t.Fatal(err)
	}
	pinned, soon, later, past := blob.Sum([]byte("pinned")), blob.Sum([]byte("soon")), blob.Sum([]byte("later")), blob.Sum([]byte("past"))
	if err := e.PinRows(ctx, "A", []blob.Digest{pinned}, time.Hour); err != nil {
		t.Fatal(err)
	}
	// past is due before the reboot; soon has 10 s left at the last
	// staging, later 50 min.
	if err := e.WindowQueue(ctx, []blob.Digest{past}, time.Minute); err != nil {
		t.Fatal(err)
	}
	old.advance(2 * time.Minute)
	if err := e.WindowQueue(ctx, []blob.Digest{soon}, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	old.advance(20 * time.Second)
	if err := e.WindowQueue(ctx, []blob.Digest{later}, 50*time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := e.Close(); err != nil {
		t.Fatal(err)
	}

	// The host reboots; its wall clock, wrong, says it is a year earlier.
	b := &fakeBoot{}
	b.advance(5 * time.Second)
	rebooted := wall.Add(-365 * 24 * time.Hour)
	e = openOnBoot(t, path, "boot-2", b, rebooted)
	if got, want := e.RowNow(), rebooted.UnixNano(); got != want {
		t.Fatalf("row clock after the reboot = %d; want the new boot's epoch from the wall clock, %d", got, want)
	}
	if n, err := e.PinCount(ctx); n != 0 || err != nil {
		t.Fatalf("PinCount after a reboot = %d, %v; want the old boot's rows gone", n, err)
	}
	var expiry int64
	if err := e.DB().QueryRowContext(ctx, `SELECT expiry FROM ns_pending`).Scan(&expiry); err != nil {
		t.Fatal(err)
	}
	if expiry >= e.RowNow() {
		t.Fatalf("an intent of the old boot expires at %d, after now (%d): it should have lapsed", expiry, e.RowNow())
	}
	due := func(want ...blob.Digest) {
		t.Helper()
		got, err := e.WindowDue(ctx, blob.Digest{}, 10)
		if err != nil {
			t.Fatal(err)
		}
		m := make(map[blob.Digest]bool)
		for _, d := range got {
			m[d] = true
		}
		if len(got) != len(want) {
			t.Fatalf("due %v; want %v", got, want)
		}
		for _, d := range want {
			if !m[d] {
				t.Fatalf("due %v; want %v", got, want)
			}
		}
	}
	due(past)
	b.advance(10*time.Second - time.Nanosecond)
	due(past)
	b.advance(time.Nanosecond)
	due(past, soon)
	b.advance(50*time.Minute - 10*time.Second)
	due(past, soon, later)

	// A second process of the new boot changes nothing.
	b.advance(time.Minute)
	if err := e.PinRows(ctx, "B", []blob.Digest{pinned}, time.Hour); err != nil {
		t.Fatal(err)
	}
	again := openOnBoot(t, path, "boot-2", b, wall)
	if a, c := e.RowNow(), again.RowNow(); a != c {
		t.Fatalf("processes of the new boot disagree on the row clock: %d and %d", a, c)
	}
	if n, err := again.PinCount(ctx); n != 1 || err != nil {
		t.Fatalf("PinCount after a second open on the same boot = %d, %v; want the new row", n, err)
	}
}

// TestRowClockAdoptsOldRows: a database from before the row clock (no
// gc_clock) keeps its rows, which are on the wall clock: the first epoch
// continues it, so a pin row written then by the wall clock protects for
// as long as it said.
func TestRowClockAdoptsOldRows(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	ctx := t.Context()
	e := openSQLiteState(t, path, meta.HostBoot)
	if _, err := e.DB().ExecContext(ctx, `DROP TABLE gc_clock`); err != nil {
		t.Fatal(err)
	}
	d := blob.Sum([]byte("old"))
	if _, err := e.DB().ExecContext(ctx, `INSERT INTO gc_pins (digest, owner, expiry) VALUES (?, 'old', ?)`,
		d[:], time.Now().Add(time.Hour).UnixNano()); err != nil {
		t.Fatal(err)
	}
	e.Close()
	e = openSQLiteState(t, path, meta.HostBoot)
	if n, err := e.PinCount(ctx); n != 1 || err != nil {
		t.Fatalf("PinCount of a row written on the wall clock before the row clock = %d, %v; want it live", n, err)
	}
	if d := time.Duration(e.RowNow() - time.Now().UnixNano()).Abs(); d > time.Minute {
		t.Fatalf("the row clock of an old database is %s off the wall clock", d)
	}
}
