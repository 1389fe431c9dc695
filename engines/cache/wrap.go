package cache

import (
	"context"

	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// sharedMedium is the capability of S3 (store/fleet.go asks for it).
type sharedMedium interface{ SharedMedium() bool }

// The cache is a large engine with the remote's optional capabilities, so
// that the store treats it as it treats the remote (its delete window on
// pglo, the fleet checks): each combination the remotes have is a type.
type (
	withWindow struct {
		*Engine
		meta.Holder
		engines.Locator
	}
	withShared struct {
		*Engine
		sharedMedium
	}
)

// StageResidue implements engines.ResidueCounter: the remote's (puts go
// to the remote tier's stage), 0 for a remote without the count.
func (e *Engine) StageResidue(ctx context.Context) (int, error) {
	if rc, ok := e.remote.(engines.ResidueCounter); ok {
		return rc.StageResidue(ctx)
	}
	return 0, nil
}

func wrap(e *Engine) engines.Large {
	w, isWin := e.remote.(meta.Holder)
	l, isLoc := e.remote.(engines.Locator)
	if sm, ok := e.remote.(sharedMedium); ok {
		return withShared{e, sm}
	}
	if isWin && isLoc {
		return withWindow{e, w, l}
	}
	return e
}
