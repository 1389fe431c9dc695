package pglo

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Engine is a large engine over PostgreSQL large objects.
type Engine struct {
	// window is the delete window in the same database (package meta's
	// gc_window), the only part of the shared state a large engine keeps.
	window  *meta.PGWindow
	name    string
	srv     postgres.Server
	pool    *pgxpool.Pool
	ownPool bool

	mu     sync.Mutex
	stages map[*stage]struct{} // live stages, for StageResidue and Close
	closed bool
}

var (
	_ engines.Large          = (*Engine)(nil)
	_ engines.ResidueCounter = (*Engine)(nil)
	_ meta.Holder            = (*Engine)(nil)
	_ engines.SidecarReader  = (*Engine)(nil)
)

// The unique index on oid is an integrity check (two entries never share
// an object) and makes the orphan count in StageResidue an index probe per
// object.
var schema = []string{
	`CREATE TABLE IF NOT EXISTS pglo_blobs (
		digest BYTEA PRIMARY KEY,
		oid    OID NOT NULL,
		size   BIGINT NOT NULL,
		sums   BYTEA
	)`,
	`CREATE UNIQUE INDEX IF NOT EXISTS pglo_blobs_oid ON pglo_blobs (oid)`,
}

const (
	// chunkSize is what one write statement carries: the knee measured for
	// large-object writes (measured: 512 KiB is the knee). Smaller
	// chunks pay a round trip per few pages; larger ones only hold more
	// memory per stage.
	chunkSize = 512 << 10
	// window is what one read statement fetches; a cursor keeps the last
	// window, so small sequential reads (FUSE's 128 KiB) cost one statement
	// per window, and reads of a window or more go straight to the caller's
	// buffer.
	window = 512 << 10
	// listPage is how many rows one List query reads.
	listPage = 1000
)

// Open connects to the database dsn names and creates the companion table
// and gc_window if needed. Errors name the server, never the password.
func Open(ctx context.Context, dsn string) (*Engine, error) {
	pool, srv, err := postgres.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	e, err := open(ctx, pool, srv, true)
	if err != nil {
		pool.Close()
		return nil, err
	}
	return e, nil
}

// OpenPool is Open over an existing pool, which the engine borrows: Close
// leaves it open, and its owner must close it after the engine.
func OpenPool(ctx context.Context, pool *pgxpool.Pool) (*Engine, error) {
	c := pool.Config().ConnConfig
	return open(ctx, pool, postgres.Server{User: c.User, Host: c.Host, Port: c.Port, Database: c.Database}, false)
}

func open(ctx context.Context, pool *pgxpool.Pool, srv postgres.Server, own bool) (*Engine, error) {
	e := &Engine{name: "pglo:" + srv.String(), srv: srv, pool: pool, ownPool: own, stages: map[*stage]struct{}{}}
	if err := postgres.CreateSchema(ctx, pool, schema...); err != nil {
		return nil, e.wrap("open", blob.Digest{}, err)
	}
	var err error
	if e.window, err = meta.OpenPGWindow(ctx, pool, e.name); err != nil {
		return nil, err
	}
	return e, nil
}

// Meta implements meta.Holder: the delete window alone.
func (e *Engine) Meta() meta.State { return e.window.Meta() }

// Name implements engines.Engine: pglo:postgres://user@host:port/database.
func (e *Engine) Name() string { return e.name }

// Server names the server and database.
func (e *Engine) Server() postgres.Server { return e.srv }

// Pool is the engine's connection pool.
func (e *Engine) Pool() *pgxpool.Pool { return e.pool }

// Close discards the stages still open (their transactions roll back, so
// their objects vanish) and closes the pool if the engine owns it.
func (e *Engine) Close() error {
	e.mu.Lock()
	e.closed = true
	live := make([]*stage, 0, len(e.stages))
	for s := range e.stages {
		live = append(live, s)
	}
	e.mu.Unlock()
	for _, s := range live {
		s.Discard()
	}
	if e.ownPool {
		e.pool.Close()
	}
	return nil
}

func (e *Engine) wrap(op string, d blob.Digest, err error) error {
	return blob.Wrap(op, e.name, d, postgres.Full(err))
}

// Has implements engines.Engine.
func (e *Engine) Has(ctx context.Context, d blob.Digest) (bool, error) {
	var one int
	switch err := e.pool.QueryRow(ctx, `SELECT 1 FROM pglo_blobs WHERE digest = $1`, d[:]).Scan(&one); {
	case errors.Is(err, pgx.ErrNoRows):
		return false, nil
	case err != nil:
		return false, e.wrap("has", d, err)
	}
	return true, nil
}

// Size implements engines.Engine from the companion row.
func (e *Engine) Size(ctx context.Context, d blob.Digest) (int64, error) {
	var n int64
	if err := e.pool.QueryRow(ctx, `SELECT size FROM pglo_blobs WHERE digest = $1`, d[:]).Scan(&n); err != nil {
		return 0, e.wrap("size", d, postgres.Missing(err))
	}
	return n, nil
}

// Open implements engines.Engine. The cursor holds no connection,
// transaction or descriptor: each window is one lo_get statement.
func (e *Engine) Open(ctx context.Context, d blob.Digest) (engines.Cursor, error) {
	var oid uint32
	var n int64
	if err := e.pool.QueryRow(ctx, `SELECT oid, size FROM pglo_blobs WHERE digest = $1`, d[:]).Scan(&oid, &n); err != nil {
		return nil, e.wrap("open", d, postgres.Missing(err))
	}
	return &cursor{e: e, d: d, oid: oid, size: n}, nil
}

// Delete implements engines.Engine: the row and its object go in one
// transaction.
func (e *Engine) Delete(ctx context.Context, d blob.Digest) error {
	err := pgx.BeginFunc(ctx, e.pool, func(tx pgx.Tx) error {
		var oid uint32
		if err := tx.QueryRow(ctx, `DELETE FROM pglo_blobs WHERE digest = $1 RETURNING oid`, d[:]).Scan(&oid); err != nil {
			return postgres.Missing(err)
		}
		// Through pg_largeobject_metadata, so that an object someone else
		// already unlinked does not block removing the row.
		_, err := tx.Exec(ctx, `SELECT lo_unlink(oid) FROM pg_largeobject_metadata WHERE oid = $1`, oid)
		return err
	})
	return e.wrap("delete", d, err)
}

// List implements engines.Engine over the companion table, keyset-paged.
func (e *Engine) List(ctx context.Context, after blob.Digest) iter.Seq2[engines.Entry, error] {
	return postgres.ListPages(ctx, e.name, after, func(ctx context.Context, after blob.Digest) (pgx.Rows, error) {
		return e.pool.Query(ctx, `SELECT digest, size FROM pglo_blobs WHERE digest > $1 ORDER BY digest LIMIT $2`, postgres.Key(after), listPage)
	})
}

// Sidecar implements engines.SidecarReader from the sums column.
func (e *Engine) Sidecar(ctx context.Context, d blob.Digest) ([]byte, error) {
	var b []byte
	if err := e.pool.QueryRow(ctx, `SELECT sums FROM pglo_blobs WHERE digest = $1`, d[:]).Scan(&b); err != nil {
		return nil, e.wrap("sidecar", d, postgres.Missing(err))
	}
	if b == nil {
		return nil, e.wrap("sidecar", d, blob.ErrMissing)
	}
	return b, nil
}

// StageResidue implements engines.ResidueCounter: the stages open in this
// process plus the large objects in the database that no entry owns. A
// stage's object lives in its open transaction, invisible to this count
// until it commits together with its row; so the second term stays 0
// unless something outside a stage's transaction leaked an object. Other
// applications' large objects in the same database count too.
func (e *Engine) StageResidue(ctx context.Context) (int, error) {
	var orphans int
	err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_largeobject_metadata m
		WHERE NOT EXISTS (SELECT 1 FROM pglo_blobs b WHERE b.oid = m.oid)`).Scan(&orphans)
	if err != nil {
		return 0, e.wrap("residue", blob.Digest{}, err)
	}
	e.mu.Lock()
	live := len(e.stages)
	e.mu.Unlock()
	return live + orphans, nil
}

// missingObject maps "large object does not exist" (an entry deleted under
// an open cursor) to blob.ErrMissing.
func missingObject(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42704" {
		return fmt.Errorf("%w: large object gone (%s)", blob.ErrMissing, pe.Message)
	}
	return err
}

// Instance implements engines.Locator: host:port/database, the same form
// as the postgres kv engine's, so a fleet can check that both tiers share
// one database.
func (e *Engine) Instance() string { return e.srv.Addr() + "/" + e.srv.Database }

// PoolSize implements engines.Locator.
func (e *Engine) PoolSize() int { return int(e.pool.Config().MaxConns) }
