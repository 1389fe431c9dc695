package postgres

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// Engine is a kv engine over one PostgreSQL database.
type Engine struct {
	name string
	srv  Server
	pool *pgxpool.Pool
	db   *sql.DB
	puts *putGroup // PutRows's group commit
	// meta is the pool's shared GC state in this database: pin rows,
	// arbitration, the sweep lease, the delete window and the corrupt
	// ledger (package meta owns their tables).
	meta *meta.Postgres
}

var (
	_ engines.KV           = (*Engine)(nil)
	_ engines.SQL          = (*Engine)(nil)
	_ meta.Putter          = (*Engine)(nil)
	_ engines.BatchDeleter = (*Engine)(nil)
	_ engines.BatchSizer   = (*Engine)(nil)
	_ engines.DeleteSafe   = (*Engine)(nil)
	_ engines.Locator      = (*Engine)(nil)
	_ meta.Holder          = (*Engine)(nil)
)

const blobsSchema = `CREATE TABLE IF NOT EXISTS blobs (
	digest BYTEA PRIMARY KEY,
	size   BIGINT NOT NULL,
	value  BYTEA NOT NULL
)`

// listPage is how many rows one List query reads.
const listPage = 1000

// Open connects to the database dsn names (a postgres:// URL or a
// key=value DSN) and creates the engine's tables if needed. Errors name
// the server, never the password.
func Open(ctx context.Context, dsn string) (*Engine, error) {
	pool, srv, err := Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	e := &Engine{name: srv.String(), srv: srv, pool: pool}
	if err := CreateSchema(ctx, pool, blobsSchema); err != nil {
		pool.Close()
		return nil, e.wrap("open", err)
	}
	e.db = stdlib.OpenDBFromPool(pool)
	e.puts = newPutGroup(e)
	e.meta, err = meta.OpenPostgres(ctx, meta.PostgresConfig{Name: e.name, Pool: pool, DB: e.db, Wrap: e.wrapD,
		BlobDelete: blobsDeleteSQL})
	if err != nil {
		e.db.Close()
		pool.Close()
		return nil, err
	}
	return e, nil
}

// Meta implements meta.Holder: every part of the shared state.
func (e *Engine) Meta() meta.State { return e.meta.Meta() }

// Instance implements engines.Locator: host:port/database.
func (e *Engine) Instance() string { return e.srv.Addr() + "/" + e.srv.Database }

// PoolSize implements engines.Locator.
func (e *Engine) PoolSize() int { return int(e.pool.Config().MaxConns) }

// inTx runs fn in a database/sql transaction and commits it.
//
// Design point (transaction termination): catch, terminate, propagate —
// every error path rolls the transaction back before returning, so no
// connection goes back to the pool inside a transaction (a pooled session
// left "idle in transaction" would hold its locks until reused).
func (e *Engine) inTx(ctx context.Context, op string, fn func(tx *sql.Tx) error) error {
	return meta.InTx(ctx, e.db, func(err error) error { return e.wrap(op, err) }, fn)
}

// Name implements engines.Engine: postgres://user@host:port/database.
func (e *Engine) Name() string { return e.name }

// Server names the server and database.
func (e *Engine) Server() Server { return e.srv }

// Pool is the engine's connection pool.
func (e *Engine) Pool() *pgxpool.Pool { return e.pool }

// DB implements engines.SQL: a database/sql handle over the engine's pool.
// It keeps no idle connections of its own, so every connection returns
// to the pool, which checks it before reuse.
func (e *Engine) DB() *sql.DB { return e.db }

// Dialect implements engines.SQL.
func (e *Engine) Dialect() string { return "postgres" }

// CursorsSurviveDelete implements engines.DeleteSafe: cursors hold a copy.
func (e *Engine) CursorsSurviveDelete() bool { return true }

// Close closes the database/sql handle and the pool.
func (e *Engine) Close() error {
	e.puts.wait()
	err := e.db.Close()
	e.pool.Close()
	return e.wrap("close", err)
}

// wrap names the engine and operation on err, and marks a full disk as
// blob.ErrNoSpace (ENOSPC at the mount), for every call that fails here.
func (e *Engine) wrap(op string, err error) error { return e.wrapD(op, blob.Digest{}, err) }

// wrapD is wrap for an operation on digest d.
func (e *Engine) wrapD(op string, d blob.Digest, err error) error {
	return blob.Wrap(op, e.name, d, Full(err))
}
