package sqlite_test

import (
	"path/filepath"
	"testing"
	"time"
)

// TestCheckpointerIdles: with nothing written, the background
// checkpointer backs off (100 ms doubling to 2 s) instead of waking every
// 100 ms for the life of the daemon: about 5 runs in 2.5 s, not 25.
func TestCheckpointerIdles(t *testing.T) {
	e := open(t, filepath.Join(t.TempDir(), "kv.db"))
	defer e.Close()
	start := e.Checkpoints()
	time.Sleep(2500 * time.Millisecond) // the window counted, not an ordering
	if n := e.Checkpoints() - start; n > 10 {
		t.Fatalf("%d background checkpoints in 2.5 s of an idle engine: it does not back off", n)
	}
}
