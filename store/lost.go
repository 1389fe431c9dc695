package store

import (
	"context"
	"fmt"

	"github.com/alkblobfs/alkblobfs/blob"
)

// A lost blob: a liveness source (a namespace's link, a liveness table)
// names it live and no tier holds it. No sweep deletes a live blob, so
// its content went behind the store's back (a file removed by hand, a
// partial restore). It is not "absent": a namespace must not silently
// shrink. Get and Stat refuse it with an error wrapping ErrLost, which
// matches ErrCorrupt (and ErrVerification): as a blob known corrupt, EIO
// through the mount (whose log names it), 500 "corrupt" over HTTP, exit 1
// from the CLI, naming the digest. A whole
// scrub reports it (Digests, ScrubResult.Lost). Putting the content again
// repairs it.

// lostErr says why d, which no tier holds, is an error and not a miss;
// nil when no source links it (a plain miss).
func (s *Store) lostErr(ctx context.Context, op string, d Digest) error {
	linked, err := s.gc.Linked(ctx, d)
	if err != nil {
		return blob.Wrap(op, "", d, fmt.Errorf("no tier holds it, and asking whether a namespace links it failed: %w", err))
	}
	if !linked {
		return nil
	}
	return blob.Wrap(op, "", d, fmt.Errorf("%w; put it again to repair it", ErrLost))
}
