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

// lostErr says why d, which no tier held a moment ago, is an error and
// not a miss; nil when it is a plain miss. again reports that a tier holds
// d now: a put committed its entry and its link together after the tiers
// missed (the link alone proves nothing without looking again), so the
// caller looks once more. A blob the ledger marks corrupt is not lost: a
// repair (put.go) deletes the bad copy before it puts the right one, and a
// reader in that gap sees a brief miss. Failing to ask (the liveness
// query, the tiers, the ledger) answers the miss, logged: it must not turn
// a 404 into a 500.
func (s *Store) lostErr(ctx context.Context, op string, d Digest) (again bool, err error) {
	linked, err := s.gc.Linked(ctx, d)
	if err != nil {
		s.log.Warn("no tier holds a blob, and asking whether a namespace links it failed; answering a miss", "op", op, "digest", d.String(), "err", err)
		return false, nil
	}
	if !linked {
		return false, nil
	}
	has, err := s.Has(ctx, d)
	if err != nil {
		s.log.Warn("a namespace links a blob no tier held; looking again failed; answering a miss", "op", op, "digest", d.String(), "err", err)
		return false, nil
	}
	if has {
		return true, nil
	}
	if _, marked, err := s.ledger.get(ctx, d); err != nil || marked {
		if err != nil {
			s.log.Warn("a namespace links a blob no tier holds; reading the corrupt ledger failed; answering a miss", "op", op, "digest", d.String(), "err", err)
		}
		return false, nil // being repaired, or known corrupt: not lost
	}
	return false, blob.Wrap(op, "", d, fmt.Errorf("%w; put it again to repair it", ErrLost))
}

// testHookMissed (export_test.go) runs when Get's tiers have missed,
// before it asks whether d is linked.
var testHookMissed func(d Digest)
