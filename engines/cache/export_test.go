package cache

// TouchWrites is the index rows this engine's touches have updated.
func (e *Engine) TouchWrites() int64 { return e.idx.touchWrites.Load() }

// CheckWhole is Warm's check of a cached copy; ErrDamaged is what it
// wraps when the copy's bytes are wrong (not merely unreadable).
var (
	CheckWhole = checkWhole
	ErrDamaged = errDamaged
)
