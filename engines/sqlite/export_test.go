package sqlite

// Fdatasyncs is how many fdatasyncs of the WAL Sync has run.
func (e *Engine) Fdatasyncs() int64 { return e.wal.fdatasyncs.Load() }

// Checkpoints is how many background checkpoints have run.
func (e *Engine) Checkpoints() int64 { return e.ckpt.runs.Load() }

// AutoCheckpoint is the writers' wal_autocheckpoint.
const AutoCheckpoint = autoCheckpoint

// SizeSQL is the SQL of the engine's size lookups by name: has, size,
// list and sizeMany (of three digests), to EXPLAIN.
func (e *Engine) SizeSQL() map[string]string {
	return map[string]string{"has": e.hasSQL(), "size": e.sizeSQL(), "list": e.listSQL(), "sizeMany": e.sizeManySQL(3)}
}

// Layout is the database's storage layout: 1 (inline) or 2 (split).
func (e *Engine) Layout() int { return int(e.layout) }

// LayoutLatest is the layout new databases get.
const LayoutLatest = int(layoutLatest)

// SetBeforeCreate makes f run in every Open between the look that found
// no blobs table and the write lock under which the layout is made, until
// the test ends.
func SetBeforeCreate(t interface{ Cleanup(func()) }, f func(path string)) {
	beforeCreate = f
	t.Cleanup(func() { beforeCreate = nil })
}
