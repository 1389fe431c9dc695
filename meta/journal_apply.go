package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"slices"
	"time"

	"golang.org/x/sys/unix"
)

// Applying the close journal's records (journal.go): each in the
// transaction of a group-commit job, in its segment's order (the mark);
// what failed is retained, with every later record, and retried.

// errOutOfOrder is the error of a record whose segment's mark does not end
// at its start: an earlier record of the segment was not applied.
var errOutOfOrder = errors.New("an earlier record of its segment is not applied yet")

// apply writes r's rows and blob in tx and moves its segment's mark past
// it, if the mark ends where r starts (else errOutOfOrder, and nothing is
// written). A namespace removed since the put drops r: the mark moves on
// and nothing else is written.
func (j *Journal) apply(ctx context.Context, tx *sql.Tx, r *journalRec) error {
	var mark int64
	err := tx.StmtContext(ctx, j.markGet).QueryRowContext(ctx, r.seg).Scan(&mark)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	if mark != r.start {
		return fmt.Errorf("close journal %s at %d: %w (applied to %d)", r.seg, r.start, errOutOfOrder, mark)
	}
	ns := r.ns
	j.pmu.Lock()
	if r.failed {
		// A retry: its outcome is pending again.
		r.failed, r.done = false, make(chan struct{})
	}
	r.started = true
	if r.settled {
		// Released before it applied: a link, with no intent between.
		ns.Settle = true
	}
	j.pmu.Unlock()
	// A link, an intent and a settle find their namespace gone before
	// they write anything (lockNS is their first statement); a pin row
	// and dropping an earlier intent (Replaces) write first, so they get
	// a savepoint to undo them by.
	saved := ns.Replaces != 0 || r.pin != nil
	if saved {
		if _, err := tx.ExecContext(ctx, `SAVEPOINT record`); err != nil {
			return err
		}
	}
	err = j.s.WriteRows(ctx, tx, Rows{Pin: r.pin, NS: ns})
	if err == nil {
		_, err = j.put(ctx, tx, r.d, r.value)
	}
	switch {
	case err != nil && !errors.Is(err, ErrNSNotFound):
		return err
	case err != nil:
		if saved {
			if _, err := tx.ExecContext(ctx, `ROLLBACK TO record`); err != nil {
				return err
			}
		}
		j.log.Warn("a closed file's namespace was removed before its close was written to the database; the file is not published",
			"namespace", r.ns.namespace(), "digest", r.d.String())
	}
	if saved {
		if _, err := tx.ExecContext(ctx, `RELEASE record`); err != nil {
			return err
		}
	}
	_, err = tx.StmtContext(ctx, j.markSet).ExecContext(ctx, r.seg, r.end)
	return err
}

// applyAll applies rs, in order, in one transaction of their own.
func (j *Journal) applyAll(ctx context.Context, rs []*journalRec) error {
	return j.b.Do(ctx, false, func(ctx context.Context, tx *sql.Tx) error {
		for _, r := range rs {
			if err := j.apply(ctx, tx, r); err != nil {
				return err
			}
		}
		return nil
	})
}

// applied is the after of r's job: an applied record leaves the backlog;
// one that failed is retained, with every record after it, until a retry
// applies them.
func (j *Journal) applied(r *journalRec) func(error) {
	return func(err error) {
		if err == nil {
			j.left(r)
			return
		}
		j.smu.Lock()
		if j.stuck == nil {
			j.stuck = err
			j.log.Error("closes already acknowledged could not be written to the database; they stay in the close journal and are retried, and closes fail until they are written",
				"journal", j.dir, "err", err)
		}
		j.retained = append(j.retained, r)
		if !j.retrying {
			j.retrying = true
			go j.retry()
		}
		j.smu.Unlock()
		j.resolved(r, err)
	}
}

// left takes applied records out of the backlog.
func (j *Journal) left(rs ...*journalRec) {
	var bytes int64
	for _, r := range rs {
		bytes += int64(len(r.value))
		j.resolved(r, nil)
	}
	j.unapplied.Add(-int64(len(rs)))
	j.unappliedBytes.Add(-bytes)
}

// resolved records r's outcome for settle and cancel: applied (err
// nil), its intent is in the database; else retained.
func (j *Journal) resolved(r *journalRec, err error) {
	j.pmu.Lock()
	if err == nil && r.ns.Intent != nil && j.pending[r.ns.Intent.ID] == r {
		delete(j.pending, r.ns.Intent.ID)
	}
	r.failed = err != nil
	if r.done != nil {
		select {
		case <-r.done:
		default:
			close(r.done)
		}
	}
	j.pmu.Unlock()
}

// retry applies the retained records, all in one transaction, once every
// record taken has either applied or been retained, backing off between
// tries; puts are refused meanwhile (stuck). Records retained while a
// try runs are kept for the next.
func (j *Journal) retry() {
	wait := 50 * time.Millisecond
	for {
		time.Sleep(wait)
		wait = min(2*wait, 5*time.Second)
		j.smu.Lock()
		rs := slices.Clone(j.retained)
		j.smu.Unlock()
		if int64(len(rs)) != j.unapplied.Load() {
			continue // records still on their way to the retained
		}
		if err := j.applyAll(context.Background(), rs); err != nil {
			for _, r := range rs {
				j.resolved(r, err)
			}
			if j.closed.Load() {
				j.smu.Lock()
				j.retrying = false
				j.smu.Unlock()
				return // they stay in the segment, for the next process
			}
			j.log.Debug("close journal: retry failed", "records", len(rs), "err", err)
			continue
		}
		j.left(rs...)
		j.smu.Lock()
		j.retained = j.retained[len(rs):]
		done := len(j.retained) == 0
		if done {
			j.retained, j.stuck, j.retrying = nil, nil, false
		}
		j.smu.Unlock()
		if done {
			j.log.Info("closes held in the close journal were written to the database", "records", len(rs))
			return
		}
	}
}

// Applied waits for every record this process journaled to be applied,
// as Visible does, and fails while some are retained (the database
// refuses them): what a removal's drain needs.
func (j *Journal) Applied(ctx context.Context) error {
	if err := j.b.Visible(ctx); err != nil {
		return err
	}
	if err := j.stuckErr(); err != nil {
		return fmt.Errorf("%w: %w", ErrJournalStuck, err)
	}
	return nil
}

// SyncRetained makes the retained records durable where they are, in
// this process's segment (fdatasync): a Sync while the database refuses
// them cannot put them in the WAL. Nothing to do when none is retained.
func (j *Journal) SyncRetained() error {
	if j == nil || j.stuckErr() == nil {
		return nil
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.syncErr != nil {
		return j.syncErr // a failed fdatasync is final (see the engine's Sync)
	}
	if j.f == nil {
		return nil
	}
	err := unix.Fdatasync(int(j.f.Fd()))
	if err == nil {
		// The segment's name too: it was renamed into place.
		var d *os.File
		if d, err = os.Open(j.dir); err == nil {
			err = d.Sync()
			d.Close()
		}
	}
	if err != nil {
		j.syncErr = fmt.Errorf("close journal: sync %s: %w", j.f.Name(), err)
	}
	return j.syncErr
}
