//go:build linux

package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
)

// TestUpgradeFleet: a fleet mount (PostgreSQL) upgraded three times while
// another host changes its namespace and sweeps.
//
//   - The change feed. Before each upgrade the mount has looked up a blob
//     (its entry is cached for an hour: only the feed drops it) and
//     looked for one that does not exist yet. While the upgrade runs, the
//     other host removes the first and puts the second. After it, the
//     upgraded mount shows both changes: the new daemon's feed resyncs at
//     its start, which covers a change made between the old daemon's last
//     notification and the new one's first.
//   - Sweeps. A blob unlinked everywhere but held open on the mount
//     survives the other host's sweeps, run throughout each upgrade, and
//     reads whole after the last; once closed, a sweep collects it.
func TestUpgradeFleet(t *testing.T) {
	t.Parallel()
	dsn := pgtest.DSN(t)
	flags := []string{"--kv", dsn, "--large", "pglo", "--fleet", "--pin-ttl", "3s"}
	c := clitest.NewCLI(t, flags...)
	c.OK("ns", "create", "ns")
	held := clitest.RandomBytes(3<<20, 91)
	heldD := clitest.Sum(held)
	p := filepath.Join(t.TempDir(), "held")
	if err := os.WriteFile(p, held, 0o644); err != nil {
		t.Fatal(err)
	}
	c.OK("put", "--ns", "ns", p)

	u := mountUpgradable(t, c, nil)
	other := t.TempDir()
	dmB := clitest.StartDaemon(t, t.TempDir(), other, flags...)
	nsU, nsB := filepath.Join(u.mnt, "ns"), filepath.Join(other, "ns")

	var f *os.File
	head := make([]byte, 64<<10)
	u.watchdog(time.Minute, "opening the held blob", func() error {
		var err error
		if f, err = os.Open(filepath.Join(nsU, heldD)); err != nil {
			return err
		}
		_, err = io.ReadFull(f, head)
		return err
	})
	defer f.Close()
	if err := os.Remove(filepath.Join(nsB, heldD)); err != nil {
		t.Fatalf("rm of the held blob on the other host: %v", err)
	}

	for round := range 3 {
		gone := []byte(fmt.Sprintf("upgrade %d: removed on the other host during it", round))
		goneD := clitest.Sum(gone)
		come := []byte(fmt.Sprintf("upgrade %d: put on the other host during it", round))
		comeD := clitest.Sum(come)
		if err := os.WriteFile(filepath.Join(nsB, "incoming", "gone"), gone, 0o644); err != nil {
			t.Fatal(err)
		}
		u.watchdog(time.Minute, "the mount's lookups before the upgrade", func() error {
			// A lookup caches the entry; polled, as the put was made on
			// the other host (an absent name is never cached).
			deadline := time.Now().Add(30 * time.Second)
			for {
				_, err := os.Stat(filepath.Join(nsU, goneD))
				if err == nil {
					break
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("the other host's put of %s never showed here: %v", goneD, err)
				}
				time.Sleep(20 * time.Millisecond) // a poll: the feed tells the kernel, not the test
			}
			if _, err := os.Stat(filepath.Join(nsU, comeD)); !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("stat of a blob not put yet: %v, want ENOENT", err)
			}
			return nil
		})

		// The other host's changes and sweeps, beside the upgrade.
		var wg sync.WaitGroup
		stop := make(chan struct{})
		var sweeps int
		errs := make(chan error, 2)
		wg.Go(func() {
			// Each round's changes start later into the upgrade (0, 40,
			// 80 ms): a spread of where they land, not an order the
			// test relies on; every landing must show.
			time.Sleep(time.Duration(round) * 40 * time.Millisecond)
			if err := os.Remove(filepath.Join(nsB, goneD)); err != nil {
				errs <- fmt.Errorf("rm on the other host: %w", err)
				return
			}
			if err := os.WriteFile(filepath.Join(nsB, "incoming", "come"), come, 0o644); err != nil {
				errs <- fmt.Errorf("put on the other host: %w", err)
			}
		})
		wg.Go(func() {
			for {
				if err := os.WriteFile(filepath.Join(other, ".alkblobfs", "sweep"), []byte("run\n"), 0o644); err != nil {
					errs <- fmt.Errorf("sweep on the other host: %w", err)
					return
				}
				sweeps++
				select {
				case <-stop:
					return
				case <-time.After(50 * time.Millisecond): // a pace, not an order
				}
			}
		})
		u.mustUpgrade()
		close(stop)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatalf("%v\nthe other host's log:\n%s", err, dmB.Stderr.String())
		}

		start := time.Now()
		u.watchdog(time.Minute, "the other host's changes on the upgraded mount", func() error {
			deadline := time.Now().Add(20 * time.Second)
			for {
				_, errGone := os.Stat(filepath.Join(nsU, goneD))
				_, errCome := os.Stat(filepath.Join(nsU, comeD))
				if errors.Is(errGone, fs.ErrNotExist) && errCome == nil {
					return nil
				}
				if time.Now().After(deadline) {
					return fmt.Errorf("20 s after upgrade %d: the blob removed on the other host: %v (want ENOENT); the one put there: %v (want found)", round, errGone, errCome)
				}
				time.Sleep(20 * time.Millisecond) // a poll, as above
			}
		})
		t.Logf("upgrade %d: %d sweeps on the other host during it; its changes showed %s after it", round, sweeps, time.Since(start).Round(time.Millisecond))
	}

	u.watchdog(time.Minute, "reading the held blob to its end", func() error {
		rest, err := io.ReadAll(f)
		if err != nil {
			return err
		}
		if got := clitest.Sum(append(head, rest...)); got != heldD {
			return fmt.Errorf("the held blob read back as %s, want %s", got, heldD)
		}
		return nil
	})
	f.Close()
	clitest.Collected(t, c, heldD, func() { clitest.SweepVia(t, other) })
	clitest.StopDaemon(t, dmB)
}
