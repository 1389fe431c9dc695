package meta

import (
	"context"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

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
// A record whose transaction is running decides by its outcome: retained
// (failed), it is marked; applied, it is the caller's.
func (j *Journal) settle(id int64) bool {
	if j == nil {
		return false
	}
	j.pmu.Lock()
	defer j.pmu.Unlock()
	r, ok := j.pending[id]
	if !ok {
		return false
	}
	for r.started && !r.failed {
		done := r.done
		j.pmu.Unlock()
		<-done
		j.pmu.Lock()
		if j.pending[id] != r {
			return false // applied: the intent is in the database
		}
	}
	r.settled = true
	delete(j.pending, id)
	return true
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
	j.dropMark(ctx, seg)
}

// dropMark deletes the mark of segment seg, whose file is gone. A failure
// leaves one row nothing reads again.
func (j *Journal) dropMark(ctx context.Context, seg string) {
	err := j.b.Do(ctx, false, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `DELETE FROM journal_marks WHERE segment = ?`, seg)
		return err
	})
	if err != nil {
		j.log.Debug("close journal: could not remove a finished segment's mark", "segment", seg, "err", err)
	}
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
