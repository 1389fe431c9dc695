package sqlite_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
)

// TestCheckpointsInBackground: the writers' automatic checkpoint is only
// a backstop (wal_autocheckpoint well above SQLite's 1000 pages), and the
// engine's checkpointer copies the log into the database file by itself:
// after 16 MiB of puts, under the backstop, the database file holds them
// within a few checkpoint intervals.
func TestCheckpointsInBackground(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kv.db")
	e := open(t, path)
	defer e.Close()
	ctx := t.Context()
	var auto int
	if err := e.DB().QueryRowContext(ctx, "PRAGMA wal_autocheckpoint").Scan(&auto); err != nil {
		t.Fatal(err)
	}
	if auto != sqlite.AutoCheckpoint {
		t.Fatalf("the writers' wal_autocheckpoint is %d pages, want %d", auto, sqlite.AutoCheckpoint)
	}
	const n, size = 2000, 8 << 10 // 16 MiB: ~4 000 pages, under the backstop
	v := make([]byte, size)
	for i := range n {
		copy(v, fmt.Sprintf("blob %d", i))
		if _, err := e.Put(ctx, blob.Sum(v), v); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() >= n*size {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the database file is %d bytes 10 s after %d bytes of puts (%d background checkpoints): the log was not checkpointed",
				fi.Size(), n*size, e.Checkpoints())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if e.Checkpoints() == 0 {
		t.Fatal("no background checkpoint ran")
	}
}
