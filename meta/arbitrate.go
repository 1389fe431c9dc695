package meta

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/alkblobfs/alkblobfs/blob"
)

// Outcomes of Host.Arbitrate besides a size.
const (
	// NotHeld: nothing protected the digest, and the kv tier (or Outside)
	// did not hold it.
	NotHeld int64 = -1
	// Protected: an unexpired pin row of some owner, or a Liveness,
	// protects the digest; nothing of it was deleted.
	Protected int64 = -2
)

// Arbitration is one hold of the arbitration lock over Digests
// (Host.Arbitrate): what protects them is read inside the transaction
// that holds their exclusive lock, and what nothing protects is deleted
// before it commits.
type Arbitration struct {
	// Digests are the candidates. Repeats are allowed, each with an
	// outcome of its own: the kv rows go at the first, and a later one
	// finds them gone (NotHeld).
	Digests []blob.Digest
	// Live are what keep digests live from tables of the host's own
	// database (namespace links and intents, liveness tables), read after
	// the locks are held and after the pin rows.
	Live []Liveness
	// Outside, when set, deletes the survivors from the tiers outside the
	// host's database (the large tier's files and objects) instead of
	// deleting their kv rows, and returns each one's size or NotHeld. It is
	// called at most once, with the survivors only, under the lock, in a
	// transaction that runs once and shares nothing with other writers
	// (on SQLite, Batcher.DoAlone): it reads only committed work, so no
	// rollback can take back what Outside did on its strength.
	Outside func(ctx context.Context, ds []blob.Digest) ([]int64, error)
}

// Liveness is a table of the host's database whose rows keep digests
// live, read by Arbitrate inside its transaction: *Links (references and
// intents) and *LiveTable. The method is unexported so that only this
// package sees the transaction.
type Liveness interface {
	liveAmongTx(ctx context.Context, tx *sql.Tx, ds []blob.Digest) (map[blob.Digest]bool, error)
}

var (
	_ Liveness = (*Links)(nil)
	_ Liveness = (*LiveTable)(nil)
)

// errNoBlobDelete refuses to open a Host without the engine's statement
// that deletes a blob's kv rows (SQLiteConfig.BlobDelete,
// PostgresConfig.BlobDelete): Arbitrate could delete no dead blob.
var errNoBlobDelete = errors.New("no BlobDelete: the engine's statement that deletes a blob's kv rows, which a delete's arbitration runs, is required")

// arbitrator is what a dialect gives arbitrateIn: its pin rows' query
// and its kv rows' delete, both in the arbitration's transaction.
type arbitrator interface {
	pinnedTx(ctx context.Context, tx *sql.Tx, ds []blob.Digest) (map[blob.Digest]bool, error)
	deleteBlobsTx(ctx context.Context, tx *sql.Tx, ds []blob.Digest) ([]int64, error)
}

// arbitrateIn is one run of a in tx, whose exclusive locks are held:
// every owner's unexpired pin rows first, then each Liveness, protect
// digests; the rest are deleted, from the kv rows (in tx) or by
// a.Outside. It builds its answer afresh, so that a run again after a
// rollback (SQLite's Batcher) decides from scratch: what an earlier run
// decided is gone with its transaction.
func arbitrateIn(ctx context.Context, tx *sql.Tx, ar arbitrator, a Arbitration) ([]int64, error) {
	ds := a.Digests
	out := make([]int64, len(ds))
	rest := make([]int, len(ds))
	for k := range rest {
		rest[k] = k
	}
	if len(ds) == 0 {
		return out, nil
	}
	pinned, err := ar.pinnedTx(ctx, tx, ds)
	if err != nil {
		return nil, err
	}
	rest = KeepLive(ds, rest, out, pinned)
	for _, l := range a.Live {
		if len(rest) == 0 {
			break
		}
		live, err := l.liveAmongTx(ctx, tx, Pick(ds, rest))
		if err != nil {
			return nil, fmt.Errorf("liveness query: %w", err)
		}
		rest = KeepLive(ds, rest, out, live)
	}
	if len(rest) == 0 {
		return out, nil
	}
	survivors := Pick(ds, rest)
	var sizes []int64
	if a.Outside != nil {
		sizes, err = a.Outside(ctx, survivors)
	} else {
		sizes, err = ar.deleteBlobsTx(ctx, tx, survivors)
	}
	if err != nil {
		return nil, err
	}
	if len(sizes) != len(survivors) {
		return nil, fmt.Errorf("arbitrate: %d sizes for %d deletes", len(sizes), len(survivors))
	}
	for k, i := range rest {
		out[i] = sizes[k]
	}
	return out, nil
}

// KeepLive marks the live among ds[idx] Protected in out and returns the
// rest of idx, in a slice of its own (idx is left as it was): the
// bookkeeping of an arbitration's outcomes, here and in the collector's
// in-process domain, which reports the same outcomes.
func KeepLive(ds []blob.Digest, idx []int, out []int64, live map[blob.Digest]bool) []int {
	kept := make([]int, 0, len(idx))
	for _, i := range idx {
		if live[ds[i]] {
			out[i] = Protected
		} else {
			kept = append(kept, i)
		}
	}
	return kept
}

// Pick returns ds[idx], in idx's order.
func Pick(ds []blob.Digest, idx []int) []blob.Digest {
	out := make([]blob.Digest, len(idx))
	for k, i := range idx {
		out[k] = ds[i]
	}
	return out
}
