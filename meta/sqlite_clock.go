package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/engines"
)

// The row clock on SQLite (engines.RowClock): what pin expiries, window
// due times and namespace intents are written and compared with; doc.go
// ("Row times") says why it is the boot clock and what a jump of the wall
// clock or a reboot does.
//
//	gc_clock(id = 1, boot_id, epoch, seen)
//
// epoch is the wall time, in unix nanoseconds, at which CLOCK_BOOTTIME read
// zero, as the boot's first process to open the database saw it; row times
// are epoch + CLOCK_BOOTTIME, so they read as unix nanoseconds, and rows
// written on the wall clock before gc_clock existed mean what they meant.
// Every later process of the boot reads the epoch and never looks at the
// wall clock again. seen is the row time of the latest window staging:
// after a reboot, a window row keeps visible_after - seen of its delay.
const clockSchema = `CREATE TABLE IF NOT EXISTS gc_clock (
	id      INTEGER PRIMARY KEY CHECK (id = 1),
	boot_id TEXT NOT NULL,
	epoch   INTEGER NOT NULL,
	seen    INTEGER NOT NULL
)`

// Boot is where the row clock comes from: the kernel's (HostBoot), or a
// test's.
type Boot struct {
	// ID is the id of this boot, the same for every process of it.
	ID func() (string, error)
	// Nanos is the boot clock in nanoseconds.
	Nanos func() (int64, error)
	// Wall is the wall clock in unix nanoseconds, read only to make an
	// epoch.
	Wall func() int64
}

// HostBoot is the kernel's boot: its boot id and CLOCK_BOOTTIME.
var HostBoot = Boot{ID: bootID, Nanos: bootNanos, Wall: func() int64 { return time.Now().UnixNano() }}

// bootID is the kernel's id of this boot, random at every boot and the
// same for every process (and container) of it.
func bootID() (string, error) {
	const path = "/proc/sys/kernel/random/boot_id"
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read the boot id: %w", err)
	}
	id := strings.TrimSpace(string(b))
	if id == "" {
		return "", fmt.Errorf("read the boot id: %s is empty", path)
	}
	return id, nil
}

// bootNanos is CLOCK_BOOTTIME in nanoseconds.
func bootNanos() (int64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, fmt.Errorf("clock_gettime(CLOCK_BOOTTIME): %w", err)
	}
	return ts.Nano(), nil
}

// rowClock is the row clock once opened.
type rowClock struct {
	epoch int64
	nanos func() (int64, error)
}

func (c rowClock) now() int64 {
	n, err := c.nanos()
	if err != nil {
		// It read at open (openClock), and a clock that could be read
		// once cannot fail later: not a state to run on.
		panic(fmt.Sprintf("sqlite row clock: %v", err))
	}
	return c.epoch + n
}

var _ engines.RowClock = (*SQLite)(nil)

// RowNow implements engines.RowClock.
func (s *SQLite) RowNow() int64 { return s.clock.now() }

// openClock fixes the row clock of this process for the database. A
// database already on this boot costs one read and no lock, so that a
// command starting beside a long write transaction does not wait for it;
// only the boot's first opener writes, in an IMMEDIATE transaction that
// reads again (concurrent first openers agree on one epoch).
func (s *SQLite) openClock(ctx context.Context, b Boot, ro bool) error {
	id, err := b.ID()
	if err != nil {
		return s.wrap("open", err)
	}
	nanos, err := b.Nanos()
	if err != nil {
		return s.wrap("open", err)
	}
	s.clock.nanos = b.Nanos
	var stored string
	var epoch int64
	err = s.db.QueryRowContext(ctx, `SELECT boot_id, epoch FROM gc_clock WHERE id = 1`).Scan(&stored, &epoch)
	if err == nil && stored == id {
		s.clock.epoch = epoch
		return nil
	}
	if ro {
		// Nothing can be recorded, and a read-only store writes and
		// deletes nothing: an epoch of its own orders only its reads.
		s.clock.epoch = b.Wall() - nanos
		return nil
	}
	return InTx(ctx, s.db, func(err error) error { return s.wrap("open", fmt.Errorf("row clock: %w", err)) }, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, clockSchema); err != nil {
			return s.wrap("open", fmt.Errorf("create gc_clock: %w", err))
		}
		var seen int64
		err := tx.QueryRowContext(ctx, `SELECT boot_id, epoch, seen FROM gc_clock WHERE id = 1`).Scan(&stored, &epoch, &seen)
		switch {
		case err == nil && stored == id: // another process of this boot was first
			s.clock.epoch = epoch
			return nil
		case errors.Is(err, sql.ErrNoRows):
			// A new database, or one from before the row clock: its rows
			// are on the wall clock, which this epoch continues.
			s.clock.epoch = b.Wall() - nanos
			_, err := tx.ExecContext(ctx, `INSERT INTO gc_clock (id, boot_id, epoch, seen) VALUES (1, ?, ?, ?)`,
				id, s.clock.epoch, s.clock.now())
			return s.wrap("open", err)
		case err != nil:
			return s.wrap("open", fmt.Errorf("read gc_clock: %w", err))
		}
		s.clock.epoch = b.Wall() - nanos
		return s.rebase(ctx, tx, id, seen)
	})
}

// rebase moves the rows of a dead boot onto this one (see the comment at
// clockSchema). seen is the old boot's last staging time.
//
// It also lapses the namespace registry's intents (ns_pending, when the
// registry has made it): they are on this clock too, and their holders
// died with the boot. That table is the registry's; only this reboot
// rebase, which must move every row time of the database in the one
// transaction that records the new epoch, writes it from here.
func (s *SQLite) rebase(ctx context.Context, tx *sql.Tx, id string, seen int64) error {
	now := s.clock.now()
	fail := func(what string, err error) error {
		return s.wrap("open", fmt.Errorf("move the rows of the previous boot onto this one: %s: %w", what, err))
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM gc_pins`); err != nil {
		return fail("pin rows", err)
	}
	// What was left of each delay, capped so that the sum cannot leave
	// int64 (SQLite would turn it into a float).
	if _, err := tx.ExecContext(ctx, `UPDATE gc_window SET visible_after = ? + min(max(visible_after - ?, 0), ?)`,
		now, seen, math.MaxInt64-now); err != nil {
		return fail("window rows", err)
	}
	var one int
	err := tx.QueryRowContext(ctx, `SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'ns_pending'`).Scan(&one)
	switch {
	case err == nil:
		if _, err := tx.ExecContext(ctx, `UPDATE ns_pending SET expiry = ? WHERE expiry >= ?`, now-1, now); err != nil {
			return fail("namespace intents", err)
		}
	case !errors.Is(err, sql.ErrNoRows):
		return fail("namespace intents", err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE gc_clock SET boot_id = ?, epoch = ?, seen = ? WHERE id = 1`, id, s.clock.epoch, now); err != nil {
		return fail("gc_clock", err)
	}
	return nil
}
