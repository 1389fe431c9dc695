package sqlite

// Fdatasyncs is how many fdatasyncs of the WAL Sync has run.
func (e *Engine) Fdatasyncs() int64 { return e.wal.fdatasyncs.Load() }
