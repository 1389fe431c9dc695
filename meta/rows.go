package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/alkblobfs/alkblobfs/blob"
)

// Rows is what a put commits beside its blob entry, as a value: the pin
// row that keeps the digest from every process's sweeps until the put's
// pin is released, and the namespace part (a link, an intent, or a
// settle). store.putRows builds it (the pin from gc, the namespace part
// from namespaces.Service); the kv engine commits it with the entry
// (Putter), or, where it cannot, the store publishes the entry first and
// writes the namespace part after it, in a transaction of its own.
type Rows struct {
	// Pin is the put's pin row (gc.Collector.BeginPublish), or nil: this
	// process holds a row for the digest already, the store keeps none,
	// or the namespace part alone keeps the digest (a serial host).
	Pin *PinRow
	// NS is the namespace part; its zero value writes nothing.
	NS NSRows
}

// NSRows is the namespace part of a put, exactly one of: a reference
// (Link alone); an intent (Intent), which may replace the writer's
// earlier intent for the same file (Replaces); or a settle (Intent with
// Settle, and Replaces): the file's final version linked in the intent's
// namespace and its earlier one dropped, atomically. Its zero value
// writes nothing. Both writers (WriteTx, namespaces.Service.CommitRows)
// refuse any other combination (Check) rather than write one part and
// drop another. Every row keeps its digest live to every process's
// arbitration once committed (Links is a Liveness).
type NSRows struct {
	// Link is a reference to add, charged to its namespace's usage and
	// quota if the namespace holds the digest through nothing else yet.
	Link *LinkRow
	// Intent is an intent to record (its ID chosen before the put, so the
	// writer knows it even when the put's answer is lost), charged as a
	// link is.
	Intent *IntentRow
	// Replaces is the writer's earlier intent, dropped first so that its
	// charge is freed before this part's is admitted; 0: none.
	Replaces int64
	// Settle: Intent is the writer's final version, and the put links it
	// instead of recording it. Written apart from the entry (the store's
	// Linker), it is recorded and then settled, two steps each atomic, so
	// that a crash between them leaves the version pending, never lost.
	Settle bool
	// links writes the rows, in the kv engine's database (Links.Rows);
	// nil for a registry that keeps its rows elsewhere (in memory), whose
	// part a put cannot commit in the entry's transaction.
	links *Links
	// admitted: the close journal judged the quota when it took the put
	// (the namespace had none), and the rows are not judged again when
	// they are applied: that close returned 0 (journal.go).
	admitted bool
}

// LinkRow is a reference a put adds: NS links D, a blob of Size bytes.
type LinkRow struct {
	NS   string
	D    blob.Digest
	Size int64
}

// ErrNSRowsMixed fails a put whose namespace part is none of the shapes
// NSRows allows: a link beside an intent, a settle or a replaced intent,
// or a settle or replaced intent without the intent.
var ErrNSRowsMixed = errors.New("the namespace part of a put must be one link, one intent or one settle")

// Check returns an error wrapping ErrNSRowsMixed when r is none of the
// shapes NSRows allows.
func (r NSRows) Check() error {
	switch {
	case r.Link != nil && (r.Intent != nil || r.Settle || r.Replaces != 0):
		return fmt.Errorf("%w: a link into namespace %q with an intent, a settle or a replaced intent", ErrNSRowsMixed, r.Link.NS)
	case r.Intent == nil && r.Settle:
		return fmt.Errorf("%w: a settle without its intent", ErrNSRowsMixed)
	case r.Intent == nil && r.Replaces != 0:
		return fmt.Errorf("%w: intent %d replaced by no intent", ErrNSRowsMixed, r.Replaces)
	}
	return nil
}

// Empty reports whether r writes nothing.
func (r NSRows) Empty() bool { return r.Link == nil && r.Intent == nil && r.Replaces == 0 }

// For is r for the put of d, a blob of size bytes: the digest and size
// its link or intent records and charges, which only the put knows.
func (r NSRows) For(d blob.Digest, size int64) NSRows {
	if r.Link != nil {
		l := *r.Link
		l.D, l.Size = d, size
		r.Link = &l
	}
	if r.Intent != nil {
		i := *r.Intent
		i.D, i.Size = d, size
		r.Intent = &i
	}
	return r
}

// Batchable reports whether a PostgreSQL put batch's one statement can
// carry r (PGBatchIntents): nothing, or an intent that replaces none and
// is bound to rows in the kv engine's database (Links.Rows). A link, an
// intent that drops another and a settle need the batch's transaction,
// where WriteTx writes them; so does an unbound intent, which the
// statement would record in a registry that is not its own: WriteTx
// refuses it (ErrNSRowsElsewhere).
func (r NSRows) Batchable() bool {
	return r.Link == nil && r.Replaces == 0 && !r.Settle && (r.Intent == nil || r.links != nil)
}

// Rows returns r with l as its writer: l's rows are in the kv engine's
// database, so a put there commits r with its entry.
func (l *Links) Rows(r NSRows) NSRows {
	r.links = l
	return r
}

// ErrNSRowsElsewhere fails a put whose namespace part cannot commit in
// the entry's transaction: its registry keeps its rows outside the kv
// engine's database (in memory). Only on a kv engine that cannot join a
// put's rows to its entry (mem) is such a part written after publish
// (store's Linker); on one that can (Putter), the put fails.
var ErrNSRowsElsewhere = errors.New("the namespace registry cannot write in the put's database transaction (open it with namespaces.Open on the kv engine)")

// WriteTx writes r in tx, the transaction of a put's entry in the kv
// engine's database, before the entry's insert: the dropped intent
// first, then the reference or the intent, each locking its namespace's
// row and judging its charge against the quota in tx (ns_usage.go).
// Over the quota it fails with an error from QuotaError; for a namespace
// that does not exist, with ErrNSNotFound. Nothing it wrote stays unless
// tx commits.
func (r NSRows) WriteTx(ctx context.Context, tx *sql.Tx) error {
	if err := r.Check(); err != nil {
		return err
	}
	if r.Empty() {
		return nil
	}
	l := r.links
	if l == nil {
		return ErrNSRowsElsewhere
	}
	if err := l.writable(); err != nil {
		return err
	}
	if r.Replaces != 0 {
		if err := l.cancelTx(ctx, tx, r.Replaces); err != nil {
			return fmt.Errorf("drop intent %d: %w", r.Replaces, err)
		}
	}
	if k := r.Link; k != nil {
		if _, err := l.linkTx(ctx, tx, k.NS, k.D, k.Size, r.admitted); err != nil {
			return fmt.Errorf("link into namespace %q: %w", k.NS, err)
		}
	}
	if i := r.Intent; i != nil && r.Settle {
		if _, err := l.linkTx(ctx, tx, i.NS, i.D, i.Size, r.admitted); err != nil {
			return fmt.Errorf("link into namespace %q: %w", i.NS, err)
		}
	} else if i != nil {
		p := NSIntent{ID: i.ID, Holder: i.Holder, TTL: i.TTL, Size: i.Size, admitted: r.admitted}
		if _, err := l.pendTx(ctx, tx, i.NS, i.D, p); err != nil {
			return fmt.Errorf("record an intent in namespace %q: %w", i.NS, err)
		}
	}
	return nil
}

// Putter is a kv engine that commits a put's rows with its entry: the
// insert (or the no-op insert of a dedup) and rows commit together or
// not at all (SQLite, in its group commit; PostgreSQL, in its put
// batch). The pin row's arbitration lock is taken before the insert: a
// dedup insert on PostgreSQL (ON CONFLICT DO NOTHING) does not lock the
// row it finds, so the lock must already be held for a concurrent
// delete of that row to wait.
type Putter interface {
	PutRows(ctx context.Context, d blob.Digest, value []byte, rows Rows) (inserted bool, err error)
}
