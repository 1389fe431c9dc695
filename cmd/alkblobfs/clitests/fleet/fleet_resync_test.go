//go:build linux

package fleet

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/jackc/pgx/v5"
)

// TestFleetResyncAfterOutage: after a PostgreSQL outage, a fleet mount
// sees a change made through another mount about a second after the
// server accepts connections again, however long the outage lasted.
//
// B has stat'ed a blob (its kernel holds the entry for an hour); the
// server stops for resyncOutage, long enough for B's change feed to have
// failed to reconnect several times; the server starts; A removes the
// blob as soon as it can. B learns of it through its feed: the rm's
// notification if its listener is back by then, else the Resync that
// follows the listener's reconnection. The clock runs from the first
// connection the server accepted to B's first stat that no longer finds
// the blob; it must be under resyncBound. (The listener's reconnection
// backoff used to reach 10 s, so B saw the rm up to 10 s late: 2.5 to
// 6 s here.)
func TestFleetResyncAfterOutage(t *testing.T) {
	t.Parallel()
	clitest.RequireFUSE(t)
	const (
		resyncOutage = 4 * time.Second
		resyncBound  = 1500 * time.Millisecond
	)
	srv := pgtest.FaultServer(t)
	flags := []string{"--kv", srv.DSN, "--large", "pglo", "--fleet"}
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "r")
	src := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(src, []byte("resync after an outage"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := strings.TrimSpace(c.OK("put", "--ns", "r", src))
	mntA, mntB := t.TempDir(), t.TempDir()
	dmA := clitest.StartDaemon(t, t.TempDir(), mntA, flags...)
	dmB := clitest.StartDaemon(t, t.TempDir(), mntB, flags...)
	onB := filepath.Join(mntB, "r", d)
	within(t, 10*time.Second, "a stat of the blob on B", func() error {
		_, err := os.Stat(onB)
		return err
	})

	srv.Stop(t)
	time.Sleep(resyncOutage) // the outage's length, not an ordering
	// The moment the server accepts again, seen from outside the mounts.
	up := make(chan time.Time, 1)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	go func() {
		for ctx.Err() == nil {
			cctx, ccancel := context.WithTimeout(ctx, time.Second)
			conn, err := pgx.Connect(cctx, srv.DSN)
			ccancel()
			if err == nil {
				up <- time.Now()
				conn.Close(context.Background())
				return
			}
			time.Sleep(5 * time.Millisecond) // polling, bounded by ctx
		}
	}()
	srv.Start(t)
	var upAt time.Time
	select {
	case upAt = <-up:
	case <-time.After(30 * time.Second):
		t.Fatal("the fault server answers pg_ctl but accepted no connection within 30s")
	}

	// A's rm: its pool's connections died with the server, and the first
	// statement after may still find one that had not heard yet.
	within(t, 20*time.Second, "rm on A after the outage", func() error {
		for {
			err := unlinkEINTR(filepath.Join(mntA, "r", d))
			if err == nil || !errors.Is(err, syscall.EIO) || time.Since(upAt) > 15*time.Second {
				return err
			}
			time.Sleep(10 * time.Millisecond) // retrying, bounded above
		}
	})
	rmAt := time.Now()
	var seen time.Duration
	within(t, 20*time.Second, "B to see the rm", func() error {
		for {
			_, err := os.Stat(onB)
			if errors.Is(err, fs.ErrNotExist) {
				seen = time.Since(upAt)
				return nil
			}
			if time.Since(upAt) > 15*time.Second {
				return errors.New("still there 15s after the server came back")
			}
			time.Sleep(2 * time.Millisecond) // polling, bounded above
		}
	})
	t.Logf("outage %s; after the server accepted again: A's rm returned at %s, B saw it at %s",
		resyncOutage, rmAt.Sub(upAt).Round(time.Millisecond), seen.Round(time.Millisecond))
	if seen > resyncBound {
		t.Errorf("B saw A's rm %s after the server came back, want under %s; B's log:\n%s", seen.Round(time.Millisecond), resyncBound, dmB.Stderr.String())
	}
	clitest.StopDaemon(t, dmA)
	clitest.StopDaemon(t, dmB)
}
