package namespaces

import (
	"context"
	"iter"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Ref is one reference of a namespace to a digest (LinkedAt: when it
// was first linked, the file's mtime on the mount; re-linking keeps it).
type Ref = meta.Ref

// Perm is who may use a namespace through a mount: the owner, group and
// permission bits of its directory, which the kernel checks when other
// users can reach the mount.
type Perm struct {
	Uid, Gid uint32
	Mode     uint32 // permission bits: Mode & 0o7777
}

func (p Perm) clean() Perm { p.Mode &= 0o7777; return p }

// Registry is a set of named namespaces, each a set of digest references.
// Every method validates the namespace name first (ValidName); a bad name
// returns ErrBadName and changes nothing. A failed call changes nothing.
//
// A Registry is a gc.Source: a digest is live while any namespace
// references it.
//
// Linking at this level does not check that the digest is in the pool; use
// a Service for that.
type Registry interface {
	gc.Source

	// Create adds an empty namespace; ErrExists if it is there. It has no
	// Perm: a mount shows it as its own user's, mode 0755.
	Create(ctx context.Context, name string) error
	// CreatePerm is Create recording p as the namespace's Perm.
	CreatePerm(ctx context.Context, name string, p Perm) error
	// Perm returns the namespace's Perm; ok is false if none was recorded
	// (Create). ErrNotFound if the namespace is absent.
	Perm(ctx context.Context, name string) (p Perm, ok bool, err error)
	// SetPerm records p as the namespace's Perm; ErrNotFound if the
	// namespace is absent.
	SetPerm(ctx context.Context, name string, p Perm) error
	// Remove deletes an empty namespace; ErrNotEmpty while it holds
	// references, ErrNotFound if it is absent.
	Remove(ctx context.Context, name string) error
	// Exists reports whether the namespace exists.
	Exists(ctx context.Context, name string) (bool, error)
	// Names streams namespace names in ascending byte order, starting after
	// `after` ("" lists from the start). Like Entries, it pages and holds no
	// lock or transaction while the caller's loop body runs.
	Names(ctx context.Context, after string) iter.Seq2[string, error]

	// Link adds a reference to d, stamping LinkedAt from the registry's
	// clock. It is idempotent: linked reports whether this call added the
	// reference, and a re-link keeps the first LinkedAt. ErrNotFound if the
	// namespace is absent.
	Link(ctx context.Context, name string, d blob.Digest) (linked bool, err error)
	// LinkSized is Link charging the namespace size bytes (the blob's
	// logical size) when the digest is new to it: a digest the namespace
	// already links or pends costs nothing and never fails for quota. A
	// link that would take the namespace over its Quota fails with an
	// error wrapping blob.ErrQuota and changes nothing. Link is LinkSized
	// with size 0: a bare Registry does not see the pool, so a Service's
	// Link, which asks the pool for the size, is what charges bytes.
	LinkSized(ctx context.Context, name string, d blob.Digest, size int64) (linked bool, err error)
	// LinkManySized is LinkMany with sizes (see LinkSized): all or
	// nothing, quota included — if the digests new to the namespace would
	// take it over its Quota, none is linked.
	LinkManySized(ctx context.Context, name string, ds []Sized) (linked int, err error)
	// LinkMany links every digest in ds atomically (all or nothing), all
	// stamped with one clock reading, and returns how many references it
	// added. Duplicates in ds are allowed. It is the bulk path (imports,
	// restores, tests): one transaction, not len(ds).
	LinkMany(ctx context.Context, name string, ds []blob.Digest) (linked int, err error)
	// Unlink drops the reference to d, and frees its charge at once
	// (not at the sweep) unless an intent of the namespace still names d.
	// An absent reference returns an error wrapping blob.ErrMissing; an
	// absent namespace ErrNotFound.
	Unlink(ctx context.Context, name string, d blob.Digest) error
	// Has returns the reference to d if there is one. ErrNotFound if the
	// namespace is absent.
	Has(ctx context.Context, name string, d blob.Digest) (Ref, bool, error)
	// HasMany reports, for each digest of ds, whether the namespace
	// references it: the batch form of Has (an existence probe over many
	// digests asks the database a page at a time, not once per digest).
	// ErrNotFound if the namespace is absent.
	HasMany(ctx context.Context, name string, ds []blob.Digest) ([]bool, error)
	// Count returns the number of references. ErrNotFound if the namespace
	// is absent.
	Count(ctx context.Context, name string) (int64, error)
	// Pend records an intent to link d into the namespace once its
	// writer has finished, and returns it. Until the intent is settled or
	// canceled, d is live (the registry reports it to the GC) but not
	// referenced: Has, Entries and Count do not show it. The intent is
	// durable where the registry is (SQL): after a crash, Recover links
	// it. It charges p.Size to the namespace's usage as LinkSized does:
	// an intent over the Quota fails with blob.ErrQuota. holder names
	// the writer (see Recover); the TTL is how long the intent lives
	// unless renewed. replaces, when non-zero, is the same writer's
	// earlier intent, dropped atomically with this one's recording: a
	// version superseded before its writer finished is never linked.
	// ErrNotFound if the namespace is absent.
	Pend(ctx context.Context, name string, d blob.Digest, p Pending) (Intent, error)
	// Settle links the intent's digest into its namespace and drops the
	// intent, atomically. It reports whether the reference was added. An
	// intent already gone (canceled, or settled by Recover) is not an
	// error: it changes nothing and reports false.
	Settle(ctx context.Context, i Intent) (linked bool, err error)
	// Cancel drops an intent without linking, and frees its charge at
	// once if nothing else in the namespace names its digest. An intent
	// already gone is not an error.
	Cancel(ctx context.Context, i Intent) error
	// Renew gives every intent of holder ttl more to live, from now.
	Renew(ctx context.Context, holder string, ttl time.Duration) error
	// Recover settles every intent of holder (a previous life of the same
	// writer, which crashed before settling) and every lapsed intent of
	// any holder (a writer that died and never came back), and returns
	// how many it settled. holder "" settles lapsed intents only.
	Recover(ctx context.Context, holder string) (int, error)
	// Holders lists the holders of intents, once each.
	Holders(ctx context.Context) ([]string, error)
	// Usage returns what the namespace holds and its quota (see Usage):
	// counters kept with the rows they count (in the same transaction on
	// SQL), read as one row. ErrNotFound if the namespace is absent.
	Usage(ctx context.Context, name string) (Usage, error)
	// Unique returns what of the namespace's usage no other namespace
	// holds (see UniqueUsage): one query over all of the namespace's
	// references and intents, O(its rows), for the surfaces a person
	// asks (ns usage, the HTTP usage route), not those that poll.
	// ErrNotFound if the namespace is absent.
	Unique(ctx context.Context, name string) (UniqueUsage, error)
	// SetQuota records q as the namespace's quota; the zero Quota clears
	// it. A quota below the current usage is allowed: nothing is removed,
	// and further growth is refused. Who may call it is AllowedQuota's
	// rule, which the surfaces apply. ErrNotFound if the namespace is
	// absent.
	SetQuota(ctx context.Context, name string, q Quota) error
	// Recount recomputes every namespace's usage counters from its rows
	// and fixes them, and returns how many namespaces it found wrong. The
	// counters change in the transactions that change the rows, so they
	// are exact after a crash too; Recount is the repair for counters
	// damaged otherwise, and what an open runs after a migration added
	// them.
	Recount(ctx context.Context) (fixed int, err error)
	// Entries streams the namespace's references in ascending digest order,
	// starting after `after` (the zero digest lists from the start, itself
	// included). It reads a page at a time by key (digest > last) and holds
	// no lock, connection or transaction while the caller's loop body runs,
	// so the caller may link and unlink while iterating; a reference added
	// or removed behind the cursor is not revisited. Memory is one page,
	// whatever the namespace's size. An absent namespace yields ErrNotFound;
	// any error ends the iteration as the last pair.
	Entries(ctx context.Context, name string, after blob.Digest) iter.Seq2[Ref, error]
}

// Joinable is a registry whose rows are in the kv engine's database, so
// that a put commits its namespace part with its entry (meta.Putter):
// Service's LinkRows, SettleRows and PendRows bind their parts to it.
// *SQL implements it.
type Joinable interface {
	// Join returns r written by this registry's rows (meta.Links.Rows).
	Join(r meta.NSRows) meta.NSRows
}

// Intent names one pending link (Registry.Pend): a digest kept live but not
// yet listed, until Settle links it or Cancel drops it. The mount's publish
// rules, which record one at each close and settle the newest at the last,
// are docs/publish.md.
type Intent int64

// newIntent returns a random non-zero intent id.
func newIntent() Intent { return Intent(meta.NewIntentID()) }

// Pending describes an intent being recorded.
type Pending struct {
	// ID is the intent's id, chosen by the writer before the put
	// (Service.PendRows), so that it knows the intent even when the put's
	// answer is lost; 0: the registry chooses one.
	ID Intent
	// Holder names the life of the writer that records the intent (see
	// Lease, which makes holders and decides when one is dead), so that
	// its next life settles what it left and no other life settles what
	// it still holds.
	Holder string
	// TTL is how long the intent lives unless renewed (Renew); once it has
	// lapsed, any Recover settles it. It counts on the registry's clock for
	// rows, never the writer's: the database server's on PostgreSQL, the
	// host's boot clock on SQLite (engines.RowClock), the process's
	// monotonic clock in memory. So a host whose clock runs ahead does not
	// settle another host's intents while their writer still renews them,
	// and one whose clock runs behind does not leave a dead writer's
	// intents unsettled for longer than their TTL.
	TTL time.Duration
	// Replaces is the writer's earlier intent for the same file, or 0.
	Replaces Intent
	// Size is the blob's logical size, charged to the namespace's usage
	// from the intent's recording if the namespace neither links nor
	// pends the digest yet (see Registry.LinkSized). An intent that would
	// take the namespace over its Quota is refused (blob.ErrQuota) and
	// not recorded; settling it later costs nothing more.
	Size int64
}

// Clock stamps LinkedAt and created_at: wall times, which a mount shows as
// mtimes. It times no intent (see Pending.TTL). gc.Clock satisfies it, so a
// store's clock can be shared.
type Clock interface{ Now() time.Time }

// ClockFunc adapts a function to Clock.
type ClockFunc func() time.Time

func (f ClockFunc) Now() time.Time { return f() }

func orWall(c Clock) Clock {
	if c == nil {
		return ClockFunc(time.Now)
	}
	return c
}

// pageSize is how many rows one page of Entries, Names or Live reads: big
// enough that a million-reference listing is a thousand round trips, small
// enough that a page is ~40 KiB.
const pageSize = 1000

// Open returns the registry that belongs with kv: tables in kv's database
// when kv is SQL-backed (engines.SQL), so links can join puts' transactions
// and survive restarts; otherwise an in-memory registry, which lives and
// dies with the process like a mem pool. A nil kv (large-only stores) also
// gets the in-memory registry.
func Open(ctx context.Context, kv engines.Engine, clock Clock) (Registry, error) {
	if s, ok := kv.(engines.SQL); ok {
		var batch *meta.Batcher
		if b, ok := kv.(meta.Batching); ok {
			batch = b.Batcher()
		}
		return openSQL(ctx, s, clock, batch)
	}
	return NewMem(clock), nil
}
