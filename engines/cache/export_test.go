package cache

// TouchWrites is the index rows this engine's touches have updated.
func (e *Engine) TouchWrites() int64 { return e.idx.touchWrites.Load() }
