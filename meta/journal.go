package meta

import (
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"crypto/rand"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/group"
)

// The close journal: a small put that returns before its transaction.
//
// A close of a small file in incoming/ commits its blob and its intent
// (or link) in a SQLite write transaction, and every transaction writes a
// page of every b-tree it touches: a cp -r, which closes one file at a
// time and waits for each close, paid a transaction (9-10 WAL pages) per
// file. The journal lets the close return once its put is written, as one
// checksummed record, to a file of this process (one write(2)); the
// record's rows are applied by the database's group commit (Batcher) as
// an ordinary job that nobody waits for, and so share a transaction with
// the records of the next closes.
//
// What a put that returned promises, and how it holds:
//
//   - It survives kill -9: the record is in the file (the page cache
//     outlives the process). Each process's records are in a segment file
//     of its own, <database>-closes/<id>.log, that it holds an exclusive
//     flock(2) on for its life; a segment nobody holds belongs to a dead
//     process, and whoever writes the store next applies what it left
//     (ReplayDead, from Links.Recover and Links.Holders: every process
//     that settles intents; a command that only reads applies nothing).
//     Which of a segment's records are applied is a row of
//     journal_marks, moved in the transaction that applies them: a record
//     applies only where the mark ends at its start, so records apply in
//     the order they were written, each once, whoever applies them.
//   - It survives a power loss once synced: Sync (the engine's, the sync
//     timer's, an fsync's) first waits for every record to be applied,
//     then syncs the WAL, as before; records the database refuses for
//     now (retained, below) are synced where they are, in the segment.
//   - This process sees it at once: every read of the rows a record
//     writes (the engine's reads of blobs, Links' of references,
//     intents and usage) first waits for what is journaled
//     (Batcher.Visible); other processes see it once its transaction
//     committed: a record is a lazy job, which waits Linger (2 ms) for
//     the next records to share its transaction, and a backlog bounds
//     how many wait (maxBacklog).
//   - Its errors were reported: a record is taken only where nothing
//     the transaction would judge can refuse it. The namespace exists
//     and has no quota (judged when the put is taken, under the guard's
//     shared lock: journal_guard.go; the rows are then applied as
//     admitted); the write of the record succeeded. A namespace removed
//     before its record applied drops the record (the removal came
//     after the put). Any other failure to apply (the database full, an
//     I/O error) keeps the record and every later one, in order, and
//     retries them; puts fail meanwhile, with that error; a settle of a
//     kept record's intent marks the record (it applies as the link),
//     and a cancel fails, for its caller to retry, rather than run
//     before it.
//   - It keeps its content from the GC: the record holds the content and
//     applies it with the rows (an insert that dedups), so a sweep that
//     deletes the digest before the record applies changes nothing; a
//     pin row the put carries (an HTTP put's, whose token outlives the
//     link) is applied with it, and this process's renewals and drops
//     of it are jobs queued after it.
//
// Only puts that carry a namespace part are journaled (the mount's
// closes, HTTP puts and put --ns); the others commit as before.

// journalMarks is the table of the segments' applied offsets.
const journalMarks = `CREATE TABLE IF NOT EXISTS journal_marks (
	segment TEXT PRIMARY KEY,
	applied INTEGER NOT NULL
) WITHOUT ROWID`

const (
	// maxBacklog bounds the records not yet applied, so that what other
	// processes see lags a close by a transaction or two (milliseconds),
	// and the memory the records' values hold: past it a put waits for
	// its own record, as a put without a journal waits for its commit.
	maxBacklog      = 64
	maxBacklogBytes = 8 << 20
	// segmentMax is the size past which a process starts a new segment
	// (and removes the old one once all of it is applied).
	segmentMax = 8 << 20
	// maxRecordValue bounds a journaled value: larger ones commit
	// directly (the kv tier's values are small; this is a backstop).
	maxRecordValue = 1 << 20
	// recordHeader is a record's length and CRC-32C, each 4 bytes.
	recordHeader = 8
	// recordVersion is the first byte of every record's body.
	recordVersion = 1
)

// BlobPut is the kv engine's insert of a blob's rows in tx (inserted:
// false when the digest was there already), which the journal applies a
// record's blob with.
type BlobPut func(ctx context.Context, tx *sql.Tx, d blob.Digest, value []byte) (inserted bool, err error)

// Journal is a database's close journal: this process's segment, and the
// replay of dead processes'. Its zero value is not usable: openJournal.
type Journal struct {
	dir   string  // <database>-closes
	s     *SQLite // the pin rows' writer
	b     *Batcher
	db    *sql.DB
	put   BlobPut
	log   *slog.Logger
	links atomic.Pointer[Links] // bound by OpenLinks: replays' rows
	// markGet and markSet read and move a segment's mark (apply).
	markGet, markSet *sql.Stmt

	unapplied      atomic.Int64 // records taken, not yet applied (retained ones included)
	unappliedBytes atomic.Int64

	// mu orders puts: their checks and their records' writes.
	mu     sync.Mutex
	f      *os.File // this process's segment, flocked; nil until the first record
	seg    string   // its id
	off    int64    // where its next record goes
	buf    []byte
	closed atomic.Bool
	// syncErr is SyncRetained's first failure, returned ever after.
	syncErr error
	// own is seg, for readers that must not wait for mu (a replay, a
	// guard's drain, which a put may be waiting for).
	own atomic.Value

	// smu guards what failed to apply. The runner takes it (applied), so
	// nothing that holds it waits for the runner.
	smu      sync.Mutex
	stuck    error         // why records are retained; nil when none is
	retained []*journalRec // failed to apply, in order
	retrying bool

	replayMu sync.Mutex // one replay at a time in this process

	// nsf is the namespaces file, <dir>/namespaces (guard.go's): a put
	// holds a shared flock on it from its namespace's check to its
	// record's write, a removal or a quota change an exclusive one; its
	// size is the generation of the namespaces' quotas and existence,
	// which free caches. Under mu.
	nsf  *os.File
	gen  nsGen
	free map[string]bool // namespaces that exist and have no quota, as of gen

	pmu     sync.Mutex
	pending map[int64]*journalRec // intents journaled and not yet applied, by id
}

// journalRec is one record: where it is, and what it applies.
type journalRec struct {
	seg        string
	start, end int64
	d          blob.Digest
	value      []byte
	pin        *PinRow // nil: none
	ns         NSRows
	// Under pmu: started, its job has run (it may still fail: done is
	// closed once it applied or was retained, failed); settled, the
	// intent's settle came before the record applied, and it applies as
	// a link.
	started, failed, settled bool
	done                     chan struct{}
}

// ErrJournalStuck is the error of a put while the close journal's records
// cannot be applied: it wraps the error of the first that failed.
var ErrJournalStuck = errors.New("closes already acknowledged wait to be written to the database")

func openJournal(ctx context.Context, s *SQLite, path string, b *Batcher, db *sql.DB, put BlobPut, log *slog.Logger) (*Journal, error) {
	if _, err := db.ExecContext(ctx, journalMarks); err != nil {
		return nil, fmt.Errorf("create the close journal's table: %w", err)
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	j := &Journal{dir: path + "-closes", s: s, b: b, db: db, put: put, log: log}
	var err error
	if j.markGet, err = db.PrepareContext(ctx, `SELECT applied FROM journal_marks WHERE segment = ?`); err != nil {
		return nil, fmt.Errorf("close journal: %w", err)
	}
	if j.markSet, err = db.PrepareContext(ctx, `INSERT INTO journal_marks (segment, applied) VALUES (?, ?)
		ON CONFLICT (segment) DO UPDATE SET applied = excluded.applied`); err != nil {
		j.markGet.Close()
		return nil, fmt.Errorf("close journal: %w", err)
	}
	b.journal = j
	return j, nil
}

// segmentPath is where segment id is.
func (j *Journal) segmentPath(id string) string { return filepath.Join(j.dir, id+".log") }

// Put journals the put of d (value, rows) if it can take it, and returns
// taken true once the record is written and its job queued: the caller
// returns as if the put had committed. taken false: the put is not one
// the journal takes (see the package comment), and the caller commits it
// itself; err is then nil. With taken true, err is an error of the
// write, or ErrJournalStuck's: nothing was journaled. had is stored's
// answer, asked once the put is known to be taken, before its record is
// queued: whether d was stored already (a dedup).
func (j *Journal) Put(ctx context.Context, d blob.Digest, value []byte, rows Rows, stored func() bool) (taken, had bool, err error) {
	ns := rows.NS
	if ns.links == nil || ns.Empty() || ns.Check() != nil || len(value) > maxRecordValue {
		return false, false, nil
	}
	ns.admitted = true
	r := &journalRec{d: d, value: value, pin: rows.Pin, ns: ns}
	had = stored()
	j.mu.Lock()
	if j.closed.Load() {
		j.mu.Unlock()
		return false, false, nil // the Batcher's own error follows
	}
	if err := j.stuckErr(); err != nil {
		j.mu.Unlock()
		return true, false, fmt.Errorf("%w: %w", ErrJournalStuck, err)
	}
	// From the namespace's check until the record is queued and counted
	// (so that a removal's drain waits for it), no process removes the
	// namespace or changes its quota (journal_guard.go). While one does,
	// the put commits directly, judged in its transaction.
	if !j.shareLocked() {
		j.mu.Unlock()
		return false, false, nil
	}
	leave := func() {
		j.unshareLocked()
		j.mu.Unlock()
	}
	if !j.unlimitedLocked(ctx, ns.links, ns.namespace()) {
		leave()
		return false, false, nil // the transaction judges it, and reports what it finds
	}
	if err := j.appendLocked(r); err != nil {
		leave()
		return true, false, err
	}
	r.done = make(chan struct{})
	if i := ns.Intent; i != nil && !ns.Settle {
		j.pmu.Lock()
		if j.pending == nil {
			j.pending = make(map[int64]*journalRec)
		}
		j.pending[i.ID] = r
		j.pmu.Unlock()
	}
	job := &batchJob{ctx: context.WithoutCancel(ctx), after: j.applied(r)}
	job.fn = func(ctx context.Context, tx *sql.Tx) error { return j.apply(ctx, tx, r) }
	wait, err := j.b.group.Start(ctx, job, group.Lazy)
	if err != nil {
		// Closed under us: the record must not outlive a put that failed.
		j.unpend(r)
		j.off = r.start
		j.f.Truncate(r.start)
		leave()
		return true, false, ErrBatcherClosed
	}
	n, bytes := j.unapplied.Add(1), j.unappliedBytes.Add(int64(len(value)))
	rotate := j.off > segmentMax
	leave()
	if n > maxBacklog || bytes > maxBacklogBytes || rotate {
		// Its outcome is not this put's: the record is written, and a
		// failure to apply it is retried (retained).
		wait()
	}
	if rotate {
		j.rotate(ctx)
	}
	return true, had, nil
}

// settle settles intent id if its record has not applied, and reports
// whether it did: the record then applies as a link. The record itself
// still says intent, so a crash before it applied leaves the intent,
// which the writer's recovery settles. false: the intent is in the
// database (or never was journaled), and the caller settles it there.
func (j *Journal) settle(id int64) bool {
	return j.takeIntent(id, func(r *journalRec) { r.settled = true })
}

// cancel is settle for a cancel, which must be durable when it returns:
// a crash after it must not leave the intent to be settled. A record
// not yet applied (queued, or running) is left to the caller, whose
// cancel is a job queued after it (false); a retained one, which only a
// retry will apply, cannot be cancelled durably before it is: the error
// says so, and the caller retries (the lease retries failed cancels).
func (j *Journal) cancel(id int64) error {
	if j == nil {
		return nil
	}
	j.pmu.Lock()
	r, ok := j.pending[id]
	var done chan struct{}
	if ok && r.started && !r.failed {
		done = r.done
	}
	j.pmu.Unlock()
	if done != nil {
		<-done
	}
	j.pmu.Lock()
	defer j.pmu.Unlock()
	if r, ok := j.pending[id]; ok && r.failed {
		return fmt.Errorf("%w: the intent's record is not written yet", ErrJournalStuck)
	}
	return nil
}

// takeIntent marks intent id's record with mark if the record has not
// applied: before its job ran, or once it is retained (failed), waiting
// for the outcome of a job that is running.
func (j *Journal) takeIntent(id int64, mark func(*journalRec)) bool {
	if j == nil {
		return false
	}
	j.pmu.Lock()
	r, ok := j.pending[id]
	if !ok {
		j.pmu.Unlock()
		return false
	}
	for r.started && !r.failed {
		// Its transaction is running: whether it commits decides.
		done := r.done
		j.pmu.Unlock()
		<-done
		j.pmu.Lock()
		if j.pending[id] != r {
			j.pmu.Unlock()
			return false // applied: the intent is in the database
		}
	}
	mark(r)
	delete(j.pending, id)
	j.pmu.Unlock()
	return true
}

// unpend forgets r's intent, whose record was not queued.
func (j *Journal) unpend(r *journalRec) {
	if i := r.ns.Intent; i != nil {
		j.pmu.Lock()
		delete(j.pending, i.ID)
		j.pmu.Unlock()
	}
}

// stuckErr is why records are retained, nil when none is.
func (j *Journal) stuckErr() error {
	j.smu.Lock()
	defer j.smu.Unlock()
	return j.stuck
}

// namespace is the namespace r writes into.
func (r NSRows) namespace() string {
	if r.Link != nil {
		return r.Link.NS
	}
	if r.Intent != nil {
		return r.Intent.NS
	}
	return ""
}

// appendLocked writes r at the end of this process's segment, opening
// one first if there is none, and sets where r is.
func (j *Journal) appendLocked(r *journalRec) error {
	if j.f == nil {
		if err := j.openSegmentLocked(); err != nil {
			return err
		}
	}
	body := encodeRecord(j.buf[:0], r)
	j.buf = body
	n := len(body) - recordHeader
	binary.LittleEndian.PutUint32(body[0:4], uint32(n))
	binary.LittleEndian.PutUint32(body[4:8], crc32.Checksum(body[recordHeader:], castagnoli))
	if w, err := j.f.WriteAt(body, j.off); err != nil {
		if w > 0 {
			j.f.Truncate(j.off) // no torn record ahead of the next one
		}
		return fmt.Errorf("write the close journal %s: %w", j.f.Name(), err)
	}
	r.seg, r.start, r.end = j.seg, j.off, j.off+int64(len(body))
	j.off = r.end
	return nil
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// openSegmentLocked starts a segment of this process: a new file, locked
// for the process's life.
func (j *Journal) openSegmentLocked() error {
	if err := os.MkdirAll(j.dir, 0o700); err != nil {
		return fmt.Errorf("close journal: %w", err)
	}
	var id [12]byte
	rand.Read(id[:])
	seg := hex.EncodeToString(id[:])
	// Locked under a name no replay looks at, then renamed: a replay
	// that found it unlocked would take it for a dead process's.
	tmp := filepath.Join(j.dir, seg+".new")
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("close journal: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("close journal: lock %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, j.segmentPath(seg)); err != nil {
		f.Close()
		os.Remove(tmp)
		return fmt.Errorf("close journal: %w", err)
	}
	j.f, j.seg, j.off = f, seg, 0
	j.own.Store(seg)
	return nil
}

// rotate ends this process's segment once everything in it is applied:
// the next record starts a new one.
func (j *Journal) rotate(ctx context.Context) {
	if err := j.b.Visible(ctx); err != nil {
		return
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.f == nil || j.stuckErr() != nil || j.off <= segmentMax || j.unapplied.Load() != 0 {
		return
	}
	j.endSegmentLocked(ctx)
}

// endSegmentLocked removes this process's segment, all of it applied, and
// its mark: the file first, under its lock, so that no replay can read a
// segment whose mark is gone.
func (j *Journal) endSegmentLocked(ctx context.Context) {
	seg := j.seg
	os.Remove(j.segmentPath(seg))
	j.f.Close()
	j.f, j.seg, j.off = nil, "", 0
	j.own.Store("")
	err := j.b.Do(ctx, false, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM journal_marks WHERE segment = ?`, seg)
		return err
	})
	if err != nil {
		j.log.Debug("close journal: could not remove a finished segment's mark", "segment", seg, "err", err)
	}
}

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

// applied is the after of r's job: an applied record leaves the backlog;
// one that failed is retained, with every record after it, until a retry
// applies them.
func (j *Journal) applied(r *journalRec) func(error) {
	return func(err error) {
		if err == nil {
			j.resolved(r, nil)
			j.unapplied.Add(-1)
			j.unappliedBytes.Add(-int64(len(r.value)))
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

// resolved records r's outcome for takeIntent: applied (err nil), its
// intent is in the database; else retained.
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
		err := j.b.Do(context.Background(), false, func(ctx context.Context, tx *sql.Tx) error {
			for _, r := range rs {
				if err := j.apply(ctx, tx, r); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			if j.closed.Load() {
				for _, r := range rs {
					j.resolved(r, err)
				}
				j.smu.Lock()
				j.retrying = false
				j.smu.Unlock()
				return // they stay in the segment, for the next process
			}
			for _, r := range rs {
				j.resolved(r, err)
			}
			j.log.Debug("close journal: retry failed", "records", len(rs), "err", err)
			continue
		}
		var bytes int64
		for _, r := range rs {
			bytes += int64(len(r.value))
			j.resolved(r, nil)
		}
		j.unapplied.Add(-int64(len(rs)))
		j.unappliedBytes.Add(-bytes)
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

// closeStmts closes the prepared statements (the engine's last step).
func (j *Journal) closeStmts() {
	if j == nil {
		return
	}
	j.markGet.Close()
	j.markSet.Close()
}

// Close applies what is journaled and removes this process's segment;
// records that cannot be applied stay in it, for the next process that
// writes the store (ReplayDead). Puts after it are not journaled.
func (j *Journal) Close(ctx context.Context) {
	j.mu.Lock()
	j.closed.Store(true)
	j.mu.Unlock()
	j.b.Visible(ctx)
	j.mu.Lock()
	defer j.mu.Unlock()
	defer func() {
		if j.nsf != nil {
			j.nsf.Close()
			j.nsf = nil
		}
	}()
	if j.f == nil {
		return
	}
	if n := j.unapplied.Load(); n != 0 {
		j.log.Error("closes already acknowledged could not be written to the database; they stay in the close journal for the next process that writes the store",
			"segment", j.f.Name(), "records", n, "err", j.stuckErr())
		j.f.Close()
		j.f = nil
		return
	}
	j.endSegmentLocked(ctx)
}

// ReplayDead applies what dead processes left in their segments, and
// returns how many records it applied. A segment whose process lives is
// locked, and skipped.
func (j *Journal) ReplayDead(ctx context.Context) (int, error) {
	if j == nil {
		return 0, nil
	}
	l := j.links.Load()
	if l == nil {
		return 0, nil // nothing to bind a record's rows to
	}
	j.replayMu.Lock()
	defer j.replayMu.Unlock()
	ents, err := os.ReadDir(j.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("close journal: %w", err)
	}
	own, _ := j.own.Load().(string)
	total := 0
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".new") {
			// A segment a crash caught between its creation and its
			// rename: it never held a record. A live one is that young
			// for microseconds.
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Minute {
				os.Remove(filepath.Join(j.dir, e.Name()))
			}
			continue
		}
		seg, ok := strings.CutSuffix(e.Name(), ".log")
		if !ok || seg == own || e.IsDir() {
			continue
		}
		n, err := j.replay(ctx, l, seg)
		total += n
		if err != nil {
			if ctx.Err() != nil {
				return total, ctx.Err()
			}
			// Kept, for a later replay (or a build that reads it): the
			// recoveries that called this go on without it; a removal's
			// drain refuses while it is kept (behind).
			j.log.Error("closes a dead process acknowledged cannot be applied yet; its journal segment is kept", "err", err)
		}
	}
	if total > 0 {
		j.log.Info("applied closes a process acknowledged before it stopped", "records", total)
	}
	return total, nil
}

// replay applies what is left of dead segment seg, in one transaction,
// then removes it.
func (j *Journal) replay(ctx context.Context, l *Links, seg string) (int, error) {
	path := j.segmentPath(seg)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("close journal: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return 0, nil // its process lives, or another replays it
	}
	// Locked: but the file may have been finished and removed between our
	// open and the lock, its mark with it. Only the file at the path now
	// is the segment.
	var held, now unix.Stat_t
	if unix.Fstat(int(f.Fd()), &held) != nil || unix.Stat(path, &now) != nil || held.Ino != now.Ino || held.Dev != now.Dev {
		return 0, nil
	}
	var mark int64
	err = j.markGet.QueryRowContext(ctx, seg).Scan(&mark)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("close journal %s: %w", path, err)
	}
	data, err := io.ReadAll(io.NewSectionReader(f, mark, 1<<62))
	if err != nil {
		return 0, fmt.Errorf("close journal %s: %w", path, err)
	}
	rs, rest, err := decodeRecords(data, seg, mark, l)
	if err != nil {
		// A whole record this build cannot read (a newer build's): keep
		// the segment for one that can.
		return 0, fmt.Errorf("close journal %s: %w; the segment is kept", path, err)
	}
	if rest > 0 {
		j.log.Warn("close journal: a torn record at the end of a dead process's segment is dropped (its close had not returned)",
			"segment", path, "bytes", rest)
	}
	if len(rs) > 0 {
		err = j.b.Do(ctx, false, func(ctx context.Context, tx *sql.Tx) error {
			for _, r := range rs {
				if err := j.apply(ctx, tx, r); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return 0, fmt.Errorf("close journal %s: apply a dead process's closes: %w", path, err)
		}
	}
	os.Remove(path)
	err = j.b.Do(ctx, false, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM journal_marks WHERE segment = ?`, seg)
		return err
	})
	if err != nil {
		j.log.Debug("close journal: could not remove a replayed segment's mark", "segment", seg, "err", err)
	}
	return len(rs), nil
}

// Record bodies: a version byte, a flags byte (link, intent, settle,
// pin), the digest, the pin row (owner, TTL), the link (namespace, size)
// or the intent (namespace, id, holder, TTL, size), the intent it
// replaces, then the value.
const (
	recLink = 1 << iota
	recIntent
	recSettle
	recPin
)

// encodeRecord appends r's header room and body to b.
func encodeRecord(b []byte, r *journalRec) []byte {
	b = append(b, make([]byte, recordHeader)...)
	var flags byte
	if r.ns.Link != nil {
		flags |= recLink
	}
	if r.ns.Intent != nil {
		flags |= recIntent
	}
	if r.ns.Settle {
		flags |= recSettle
	}
	if r.pin != nil {
		flags |= recPin
	}
	b = append(b, recordVersion, flags)
	b = append(b, r.d[:]...)
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	if p := r.pin; p != nil {
		str(p.Owner)
		b = binary.AppendVarint(b, int64(p.TTL))
	}
	if k := r.ns.Link; k != nil {
		str(k.NS)
		b = binary.AppendVarint(b, k.Size)
	}
	if i := r.ns.Intent; i != nil {
		str(i.NS)
		b = binary.LittleEndian.AppendUint64(b, uint64(i.ID))
		str(i.Holder)
		b = binary.AppendVarint(b, int64(i.TTL))
		b = binary.AppendVarint(b, i.Size)
	}
	b = binary.AppendVarint(b, r.ns.Replaces)
	return append(b, r.value...)
}

// decodeRecords parses the records of data, which starts at offset base
// of segment seg, binding their rows to l; rest is how many bytes at the
// end are not a whole record with its checksum (a write a crash tore).
// A whole record that does not decode is an error: it is no tear.
func decodeRecords(data []byte, seg string, base int64, l *Links) (rs []*journalRec, rest int, err error) {
	off := 0
	for len(data)-off >= recordHeader {
		n := int(binary.LittleEndian.Uint32(data[off:]))
		sum := binary.LittleEndian.Uint32(data[off+4:])
		if n > len(data)-off-recordHeader || n < 2+len(blob.Digest{}) {
			// Short: torn. Too small to be a record: zeros a power loss
			// left where the file grew (the CRC of nothing is 0).
			break
		}
		body := data[off+recordHeader : off+recordHeader+n]
		if crc32.Checksum(body, castagnoli) != sum {
			break
		}
		r, ok := decodeBody(body, l)
		if !ok {
			return nil, 0, fmt.Errorf("the record at %d does not decode (version %d)", base+int64(off), body[0])
		}
		r.seg, r.start, r.end = seg, base+int64(off), base+int64(off+recordHeader+n)
		rs = append(rs, r)
		off += recordHeader + n
	}
	return rs, len(data) - off, nil
}

// decodeBody is encodeRecord's inverse.
func decodeBody(b []byte, l *Links) (*journalRec, bool) {
	bad := false
	take := func(n int) []byte {
		if bad || n < 0 || n > len(b) {
			bad = true
			return nil
		}
		v := b[:n]
		b = b[n:]
		return v
	}
	varint := func() int64 {
		if bad {
			return 0
		}
		v, n := binary.Varint(b)
		if n <= 0 {
			bad = true
			return 0
		}
		b = b[n:]
		return v
	}
	str := func() string {
		if bad {
			return ""
		}
		v, n := binary.Uvarint(b)
		if n <= 0 {
			bad = true
			return ""
		}
		b = b[n:]
		return string(take(int(v)))
	}
	head := take(2)
	if bad || head[0] != recordVersion {
		return nil, false
	}
	flags := head[1]
	r := &journalRec{}
	copy(r.d[:], take(len(r.d)))
	if flags&recPin != 0 {
		r.pin = &PinRow{D: r.d}
		r.pin.Owner = str()
		r.pin.TTL = time.Duration(varint())
	}
	if flags&recLink != 0 {
		r.ns.Link = &LinkRow{D: r.d}
		r.ns.Link.NS = str()
		r.ns.Link.Size = varint()
	}
	if flags&recIntent != 0 {
		i := &IntentRow{D: r.d}
		i.NS = str()
		if id := take(8); !bad {
			i.ID = int64(binary.LittleEndian.Uint64(id))
		}
		i.Holder = str()
		i.TTL = time.Duration(varint())
		i.Size = varint()
		r.ns.Intent = i
	}
	r.ns.Settle = flags&recSettle != 0
	r.ns.Replaces = varint()
	if bad {
		return nil, false
	}
	r.value = b
	r.ns = l.Rows(r.ns)
	r.ns.admitted = true
	return r, r.ns.Check() == nil
}
