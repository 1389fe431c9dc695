// Package engines defines the storage seam of alkblobfs: one small [Engine]
// interface every engine implements, the two put shapes ([KV] whole-value
// puts, [Large] staged puts), and optional capabilities the store detects and
// falls back from.
//
// Engines are opaque digest → bytes maps. They never learn about namespaces,
// pins or liveness, and they never verify content: the store hashes on the
// way in and verifies on the way out. An engine trusts the digest it is
// given.
//
// # Errors
//
// A missing key is an error wrapping blob.ErrMissing (from Size, Open and
// Delete). Medium failures are returned wrapped with the operation, engine
// and digest (blob.Wrap). Engines never return syscall.Errno to callers as a
// contract; fusefs maps errors to errnos in one place.
//
// # Concurrency
//
// Every method is safe for concurrent use. Puts of the same digest may race:
// exactly one stores the value and the others observe it present (dedup);
// no put ever fails because another put of the same digest won.
package engines

import (
	"context"
	"database/sql"
	"golang.org/x/sys/unix"
	"io"
	"iter"
	"os"
	"strconv"
	"strings"

	"github.com/alkblobfs/alkblobfs/blob"
)

// Entry is one listed pool entry.
type Entry struct {
	Digest blob.Digest
	Size   int64
}

// Engine is the method set every engine implements, tier-agnostic.
type Engine interface {
	// Name is the engine kind and location for messages, e.g. "sqlite:/x/kv.db".
	Name() string
	// Has reports whether d is stored. Metadata only.
	Has(ctx context.Context, d blob.Digest) (bool, error)
	// Size returns d's length in bytes from metadata, never by reading the
	// content. A missing key returns an error wrapping blob.ErrMissing.
	Size(ctx context.Context, d blob.Digest) (int64, error)
	// Open returns a read cursor over d. A missing key returns an error
	// wrapping blob.ErrMissing. The cursor stays valid after a concurrent
	// Delete of d (POSIX-like: an open blob stays readable until Close)
	// where the medium allows; see each engine's doc.
	Open(ctx context.Context, d blob.Digest) (Cursor, error)
	// Delete removes d. A missing key returns an error wrapping
	// blob.ErrMissing (the store uses it to fall through tiers).
	Delete(ctx context.Context, d blob.Digest) error
	// List streams every entry in ascending digest order, starting after
	// `after` (the zero digest lists from the start). It never materializes
	// the whole listing; implementations page internally and hold no lock or
	// transaction between yields, so the caller may write to the engine while
	// iterating. An error ends the iteration as the last pair.
	List(ctx context.Context, after blob.Digest) iter.Seq2[Entry, error]
	// Close releases the engine's resources.
	Close() error
}

// Cursor reads one blob. ReadAt follows io.ReaderAt: a read that ends at or
// crosses Len returns the bytes available and io.EOF; a read starting past
// Len returns 0, io.EOF. Len comes from metadata.
type Cursor interface {
	io.ReaderAt
	Len() int64
	Close() error
}

// FileCursor is a cursor backed by a plain file on a local filesystem. The
// mount uses it for FUSE passthrough; the store uses it for zero-copy reads.
// File is owned by the cursor: do not close it.
type FileCursor interface {
	Cursor
	File() FileHandle
}

// FileHandle is the subset of *os.File that FileCursor exposes.
type FileHandle interface {
	Fd() uintptr
	Name() string
}

// KV is a small-blob engine: values are stored and read whole.
type KV interface {
	Engine
	// Put stores value under d unless d is already present (insert or
	// ignore). inserted reports whether this call stored it.
	Put(ctx context.Context, d blob.Digest, value []byte) (inserted bool, err error)
}

// Large is a streaming engine for blobs of any size.
type Large interface {
	Engine
	// Stage opens a staging writer. Nothing is visible until Commit.
	Stage(ctx context.Context) (Stage, error)
}

// Stage is a put in progress on a Large engine. Exactly one of Commit or
// Discard ends it; Discard after Commit (or twice) is a no-op, so callers
// `defer st.Discard()`. Every failure path, including a failed Commit,
// leaves no residue: no stage file, no orphan object.
type Stage interface {
	io.Writer
	// Commit publishes what was written under d. If d is already present
	// the staged bytes are dropped (dedup) and Commit succeeds. The engine
	// does not hash: the store has already verified d.
	Commit(ctx context.Context, d blob.Digest) error
	// Discard drops the staged bytes.
	Discard() error
}

// RandomStage is a Stage that also allows random-access writes, reads back
// and truncation before Commit. The local engine's stage files implement it;
// the mount's incoming/ files write into one directly so that publishing a
// large file is a rename, not a copy.
type RandomStage interface {
	Stage
	io.WriterAt
	io.ReaderAt
	Truncate(size int64) error
	Size() (int64, error)
}

// FileStage is implemented by stages whose content is one local file
// (the local engine's stage files): File is that file while the stage
// lasts, nil once it ended. An upgrade hands an upload in progress to
// another process (store.Upload.Export) as a descriptor of it.
type FileStage interface {
	File() *os.File
}

// StatFS is implemented by engines that sit on a local filesystem, so the
// mount's statfs can report real capacity.
type StatFS interface {
	// Root is a path on the engine's backing filesystem.
	Root() string
}

// Locator is implemented by engines whose data lives on a database server,
// so that a fleet's configuration can be checked: Instance names the server
// and database ("host:port/database"); PoolSize is the most connections the
// engine's pool opens.
type Locator interface {
	Instance() string
	PoolSize() int
}

// Ephemeral is implemented by engines whose content dies with the process
// (mem). A fleet refuses them.
type Ephemeral interface {
	Ephemeral() bool
}

// SQL is implemented by engines backed by database/sql. A namespace
// registry keeps its tables in the same database, and the store can join a
// namespace link to a kv put's commit (meta.Putter).
type SQL interface {
	DB() *sql.DB
	// Dialect is "sqlite" or "postgres".
	Dialect() string
}

// ResidueCounter is implemented by Large engines so that tests can count
// what failed or abandoned stages leave behind: the local engine counts stage
// files, mem counts open stages, a large-object engine counts orphan
// objects. Every Stage path that ended (Commit or Discard) must leave the
// count where it was before the stage began.
type ResidueCounter interface {
	StageResidue(ctx context.Context) (int, error)
}

// DeleteSafe is implemented by engines whose cursors stay readable after a
// Delete of their digest (POSIX unlink semantics; see Engine.Open). The
// conformance suite holds an engine to it when CursorsSurviveDelete reports
// true.
type DeleteSafe interface {
	CursorsSurviveDelete() bool
}

// SidecarStage is an optional capability of a Large engine's stage: a small
// opaque value stored beside the blob at Commit. The store keeps per-chunk
// checksums there. Because a sidecar is a pure function of the content, a
// dedup Commit may keep or replace an existing one.
type SidecarStage interface {
	SetSidecar(b []byte)
}

// SidecarReader reads the value a SidecarStage stored. A blob without one
// returns an error wrapping blob.ErrMissing; readers then fall back to
// verifying from the start of the blob.
type SidecarReader interface {
	Sidecar(ctx context.Context, d blob.Digest) ([]byte, error)
}

// BatchDeleter is an optional capability for engines where one round trip
// per delete dominates a sweep (SQL engines): DeleteMany removes every
// digest of ds it holds, in one transaction, and reports each one's size,
// or -1 for a digest it does not hold.
type BatchDeleter interface {
	DeleteMany(ctx context.Context, ds []blob.Digest) ([]int64, error)
}

// BatchSizer is an optional capability for engines where one round trip
// per Size dominates a listing (SQL engines): SizeMany returns each
// digest's size, or -1 for a digest the engine does not hold.
type BatchSizer interface {
	SizeMany(ctx context.Context, ds []blob.Digest) ([]int64, error)
}

// Syncer is implemented by engines whose commits survive a crash of the
// process but not yet a power loss (SQLite in WAL mode with
// synchronous=NORMAL): Sync returns once every transaction committed
// before the call is on stable storage. Engines durable at commit
// (PostgreSQL, and the local, pglo and s3 large tiers) and mem, which has
// nothing to keep, do not implement it.
type Syncer interface {
	Sync(ctx context.Context) error
}

// ReadOnly is implemented by engines that open a store on read-only media
// (a read-only filesystem, a directory they may not write): ReadOnly
// reports that this one did, so that reads work and every write fails.
type ReadOnly interface {
	ReadOnly() bool
}

// Writable reports whether dir may be written: false on a read-only
// filesystem or without write permission; true for a directory that does
// not exist yet (creating it reports any error).
func Writable(dir string) bool {
	err := unix.Access(dir, unix.W_OK)
	return err != unix.EROFS && err != unix.EACCES && err != unix.EPERM
}

// PGSchemaLock is the PostgreSQL advisory lock key that serializes schema
// creation in every package that keeps tables there: concurrent CREATE
// TABLE IF NOT EXISTS of one table can fail with a unique violation in the
// catalog.
const PGSchemaLock int64 = 0x616c6b626c6f62 // "alkblob"

// Querier is what *sql.DB and *sql.Tx share: a statement that runs on
// its own, or inside a transaction the caller holds.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// DigestRows is what ScanDigests reads: *sql.Rows, or pgx.Rows.
type DigestRows interface {
	Next() bool
	Scan(dest ...any) error
	Err() error
}

// ScanDigests calls add with each row's single column, a 32-byte digest.
// The caller closes rows.
func ScanDigests(rows DigestRows, add func(blob.Digest)) error {
	for rows.Next() {
		var b []byte
		if err := rows.Scan(&b); err != nil {
			return err
		}
		d, err := blob.FromBytes(b)
		if err != nil {
			return err
		}
		add(d)
	}
	return rows.Err()
}

// Rebind rewrites `?` placeholders as `$1, $2, …` for PostgreSQL (dialect
// "postgres"); other dialects keep them. The statements it serves hold no
// `?` inside literals, so a plain scan suffices.
func Rebind(dialect, q string) string {
	if dialect != "postgres" {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 16)
	n := 0
	for i := 0; i < len(q); i++ {
		if q[i] == '?' {
			n++
			b.WriteByte('$')
			b.WriteString(strconv.Itoa(n))
			continue
		}
		b.WriteByte(q[i])
	}
	return b.String()
}

// ScanSizes is ScanDigests for rows of (digest, size).
func ScanSizes(rows DigestRows, add func(blob.Digest, int64)) error {
	for rows.Next() {
		var b []byte
		var n int64
		if err := rows.Scan(&b, &n); err != nil {
			return err
		}
		d, err := blob.FromBytes(b)
		if err != nil {
			return err
		}
		add(d, n)
	}
	return rows.Err()
}
