// Package metatest is the conformance suite of package meta's shared
// state, run against every dialect through the engines that open it
// (engines/sqlite, engines/postgres, engines/pglo's window, engines/mem's
// ledger), and against the collector's in-process window (Window):
//
//   - Host: pin rows, renewal, reaping, TTLs on the row clock, a delete's
//     arbitration (pin rows of every owner, a liveness table, the kv rows'
//     delete, the Outside form; a failure after a delete commits nothing)
//     and its lock across two processes, the sweep lease.
//   - Window, WindowEngine: the delete window's contract, and that it is
//     independent of the pool.
//   - Ledger: the corrupt ledger, and that a second process reads it.
//   - Reopen: window rows and their times survive a close.
//
// The SQLite row clock's own cases (a reboot, an old database, a wall
// clock that jumps) are meta's tests (meta/sqlite_clock_test.go), which
// move the boot clock by hand.
package metatest

import (
	"slices"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/meta"
)

// state is e's shared state; the test fails when e keeps none.
func state(t *testing.T, e engines.Engine) meta.State {
	t.Helper()
	h, ok := e.(meta.Holder)
	if !ok {
		t.Fatalf("%s keeps no shared state (meta.Holder)", e.Name())
	}
	return h.Meta()
}

// put stores v in e under its sha256, through the engine's put shape, and
// returns the digest.
func put(t *testing.T, e engines.Engine, v []byte) blob.Digest {
	t.Helper()
	ctx := t.Context()
	d := blob.Sum(v)
	switch x := e.(type) {
	case engines.KV:
		if _, err := x.Put(ctx, d, v); err != nil {
			t.Fatalf("put %s: %v", d.Short(), err)
		}
	case engines.Large:
		st, err := x.Stage(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Discard()
		if _, err := st.Write(v); err != nil {
			t.Fatal(err)
		}
		if err := st.Commit(ctx, d); err != nil {
			t.Fatal(err)
		}
	default:
		t.Fatalf("%s can take no put", e.Name())
	}
	return d
}

func sortDigests(ds []blob.Digest) { slices.SortFunc(ds, blob.Digest.Compare) }
