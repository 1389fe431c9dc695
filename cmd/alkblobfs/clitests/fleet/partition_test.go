//go:build linux

package fleet

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
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

// Fleet hosts cut off from the database: each mount reaches PostgreSQL
// through a fault proxy of its own, so that one host can be cut while the
// others, and the CLI (which goes straight to the server), keep going.

// Short timings, so that a cut of twice the pin TTL takes seconds: pins
// live 2 s (renewed every 667 ms), and a wait on a silent server fails
// after 1 s.
const (
	cutTTL    = 2 * time.Second
	cutOpWait = time.Second
	// cutBound is what a request on a cut host may take: the op timeout
	// for its first wait, with room for a second and a loaded machine.
	cutBound = 4 * cutOpWait
)

// boundedErr runs op, which must fail within cutBound, and returns its
// error and how long it took.
func boundedErr(t *testing.T, what string, op func() error) error {
	t.Helper()
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- op() }()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("%s on a cut host succeeded", what)
		}
		t.Logf("%s on the cut host: %v after %s", what, err, time.Since(start).Round(time.Millisecond))
		return err
	case <-time.After(cutBound):
		// The goroutine stays blocked in the kernel; the daemon's cleanup
		// aborts the mount, which frees it.
		t.Fatalf("%s on a cut host still waiting after %s", what, cutBound)
		return nil
	}
}

// TestPartitionPinsLapse: three fleet mounts. A holds two blobs open, X
// (which only A's pin keeps) and Y (which a namespace links too). A is
// blackholed for twice the pin TTL while B sweeps and C reads. What must
// hold:
//   - B deletes X only once A's pin rows have had time to lapse, and never
//     deletes Y; no namespace link ever points at a deleted blob;
//   - on A, requests that need the database (a lookup, a cat, a close)
//     fail within the op timeout instead of hanging;
//   - C keeps serving;
//   - once A is back, it logs and counts the lapse and re-pins what it
//     still holds: Y, unlinked then, survives B's sweeps and reads to its
//     last byte on A; a read of X's unread part fails (EIO), never wrong
//     bytes.
func TestPartitionPinsLapse(t *testing.T) {
	// Not parallel: ops on the cut host must fail within cutBound.
	clitest.RequireFUSE(t)
	dsn := pgtest.DSN(t)
	c := clitest.NewCLI(t, fleetFlags(t, dsn, "pglo", nil)...)
	c.OK("ns", "create", "p")
	put := func(n int, seed uint64) (string, []byte) {
		content := clitest.RandomBytes(n, seed)
		src := filepath.Join(t.TempDir(), "f")
		if err := os.WriteFile(src, content, 0o644); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(c.OK("put", "--ns", "p", src)), content
	}
	x, xContent := put(4<<20, 1) // pglo: read window by window
	y, _ := put(1<<20, 2)
	a, b, cc := startSkewHost(t, "A", "", dsn, "pglo"), startSkewHost(t, "B", "", dsn, "pglo"), startSkewHost(t, "C", "", dsn, "pglo")

	head := make([]byte, 4096)
	open := func(d string) *os.File {
		f := clitest.OpenWithin(t, filepath.Join(a.mnt, "p", d), 30*time.Second)
		t.Cleanup(func() { f.Close() })
		if _, err := io.ReadFull(f, head); err != nil {
			t.Fatal(err)
		}
		return f
	}
	fx, fy := open(x), open(y)
	yHead := append([]byte(nil), head...)
	c.OK("unlink", "p", x)
	z, _ := put(clitest.SmallSize, 3) // linked, never looked up on A

	a.proxy.Blackhole()
	cut := time.Now()
	t.Logf("A cut off (blackhole)")

	// Requests on A that need the database fail within the bound.
	boundedErr(t, "stat of an unseen blob", func() error { _, err := os.Stat(filepath.Join(a.mnt, "p", z)); return err })
	boundedErr(t, "cat of an unseen blob", func() error { _, err := os.ReadFile(filepath.Join(a.mnt, "p", z)); return err })
	boundedErr(t, "a put into incoming/", func() error {
		return os.WriteFile(filepath.Join(a.mnt, "p", "incoming", "during-cut"), []byte("written while cut off"), 0o644)
	})

	// Each failure is logged with its cause.
	if log := a.dm.Stderr.String(); !strings.Contains(log, "request failed") || !strings.Contains(log, "sent nothing for "+cutOpWait.String()) {
		t.Fatalf("A's log does not name the cause of its failed requests:\n%s", log)
	}

	// B sweeps until X is gone; A's rows protect it for at least the
	// part of the TTL left after their last renewal.
	var deletedAt time.Duration
	clitest.Eventually(t, 6*cutTTL+10*time.Second, "B to delete X once A's pins lapsed", func() bool {
		if rep, _ := b.sweep(t); rep["aborted"] != nil {
			t.Logf("B's sweep aborted: %v", rep["aborted"])
		}
		if !strings.Contains(c.OK("ls"), x) {
			deletedAt = time.Since(cut)
			return true
		}
		return false
	})
	t.Logf("B deleted X %s after A was cut (pin TTL %s)", deletedAt.Round(time.Millisecond), cutTTL)
	if deletedAt < cutTTL/3 {
		t.Fatalf("X was deleted %s after the cut: A's pin rows should have protected it for at least a third of the TTL (%s)", deletedAt, cutTTL)
	}
	// C serves Y meanwhile, whole.
	if got := clitest.FileSHA(t, filepath.Join(cc.mnt, "p", y)); got != y {
		t.Fatalf("Y read through C during the cut as %s", got)
	}
	for time.Since(cut) < 2*cutTTL {
		b.sweep(t)
	}
	if !strings.Contains(c.OK("ls", "p"), y) || !strings.Contains(c.OK("ls"), y) {
		t.Fatal("Y, which a namespace links, was deleted")
	}

	a.proxy.Restore()
	t.Logf("A back after %s", time.Since(cut).Round(time.Millisecond))
	clitest.Eventually(t, 10*time.Second, "A to count the lapse of its pin rows", func() bool { return a.pinsLapsed(t) >= 2 })
	clitest.Eventually(t, 5*time.Second, "A to log the lapse", func() bool {
		return strings.Contains(a.dm.Stderr.String(), "pin rows lapsed")
	})

	// Y, re-pinned, is A's alone once unlinked: it survives B's sweeps
	// and reads to its last byte.
	c.OK("unlink", "p", y)
	clitest.StopDaemon(t, cc.dm) // C read Y: its released row may linger a tick
	for range 3 {
		b.sweep(t)
	}
	if !strings.Contains(c.OK("ls"), y) {
		t.Fatal("Y, open on A and re-pinned after the cut, was deleted once unlinked")
	}
	clitest.ReadsTo(t, fy, yHead, y)
	// X's unread part: EIO, or — had the kernel cached it — X's own bytes.
	buf := make([]byte, 4096)
	off := int64(len(xContent) - len(buf))
	n, err := fx.ReadAt(buf, off)
	switch {
	case err == nil || errors.Is(err, io.EOF):
		if string(buf[:n]) != string(xContent[off:off+int64(n)]) {
			t.Fatal("A read wrong bytes from a deleted blob")
		}
		t.Logf("the deleted blob's tail came from a cache: %d right bytes", n)
	case !errors.Is(err, syscall.EIO):
		t.Fatalf("a read on A of a blob deleted while A was cut = %v; want EIO", err)
	}

	// Every link resolves to a blob that reads back whole.
	for _, d := range clitest.Lines(c.OK("ls", "p")) {
		if got := clitest.FileSHA(t, filepath.Join(b.mnt, "p", d)); got != d {
			t.Fatalf("%s, linked, reads back as %s", d, got)
		}
	}
	fx.Close()
	fy.Close()
	for _, h := range []*skewHost{a, b} {
		clitest.StopDaemon(t, h.dm)
	}
}

// TestPartitionMidClose: A is cut (reset, and once blackholed) at a
// random moment of the close of a large file. The close fails with an
// error, or the file is published whole; either way nothing is
// half-published, and no stage is left on any medium once A is back: no
// large object that no entry owns, no pending put in the kv, nothing in
// A's scratch directory.
func TestPartitionMidClose(t *testing.T) {
	// Not parallel: ops on the cut host must fail within cutBound.
	clitest.RequireFUSE(t)
	rounds := 4
	if os.Getenv("ALKBLOBFS_LONG") == "1" {
		rounds = 30
	}
	dsn := pgtest.DSN(t)
	c := clitest.NewCLI(t, fleetFlags(t, dsn, "pglo", nil)...)
	c.OK("ns", "create", "p")
	a, b := startSkewHost(t, "A", "", dsn, "pglo"), startSkewHost(t, "B", "", dsn, "pglo")
	db, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	rng := rand.New(rand.NewPCG(7, 7))
	var failed, published int
	for i := range rounds {
		content := clitest.RandomBytes(2<<20+i, uint64(100+i))
		d := clitest.Sum(content)
		f, err := os.Create(filepath.Join(a.mnt, "p", "incoming", "f"))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.Write(content); err != nil {
			t.Fatal(err)
		}
		blackhole := i == 1
		done := make(chan error, 1)
		go func() { done <- f.Close() }()
		time.Sleep(time.Duration(rng.IntN(80)) * time.Millisecond) // the moment of the cut
		if blackhole {
			a.proxy.Blackhole()
		} else {
			a.proxy.Reset()
		}
		var cerr error
		select {
		case cerr = <-done:
		case <-time.After(cutBound):
			t.Fatalf("round %d: a close on a cut host still waiting after %s", i, cutBound)
		}
		a.proxy.Restore()
		linked := strings.Contains(c.OK("ls", "p"), d)
		// A close that returned 0 is linked once its RELEASE's settle has
		// run, and the kernel sends that RELEASE after the close returns:
		// the cut may fail it, and the lease retries it at its next tick
		// (TTL/3; TestCloseThenSettleCut). Only a link that never shows is
		// a loss.
		if cerr == nil && !linked {
			late := time.Now()
			for !linked && time.Since(late) < 10*time.Second {
				time.Sleep(50 * time.Millisecond) // polling, bounded
				linked = strings.Contains(c.OK("ls", "p"), d)
			}
			t.Logf("round %d: the close returned 0; the link showed %s later (%v): its settle was retried", i, time.Since(late).Round(time.Millisecond), linked)
		}
		t.Logf("round %d (%s): close = %v, published = %v", i, map[bool]string{true: "blackhole", false: "reset"}[blackhole], cerr, linked)
		switch {
		case cerr == nil && !linked:
			t.Fatalf("round %d: the close succeeded but %s is not linked", i, d)
		case linked:
			published++
			if got := clitest.FileSHA(t, filepath.Join(b.mnt, "p", d)); got != d {
				t.Fatalf("round %d: published %s reads back as %s", i, d, got)
			}
		default:
			failed++
		}
		clitest.Eventually(t, 10*time.Second, "no stage left behind", func() bool {
			var orphans, pending int
			if err := db.QueryRow(t.Context(), `SELECT
				(SELECT count(*) FROM pg_largeobject_metadata m WHERE NOT EXISTS (SELECT 1 FROM pglo_blobs b WHERE b.oid = m.oid)),
				(SELECT count(*) FROM ns_pending)`).Scan(&orphans, &pending); err != nil {
				t.Fatal(err)
			}
			st := a.stats(t)
			inFlight, _ := st["uploads_in_flight"].(float64)
			return orphans == 0 && pending == 0 && inFlight == 0
		})
		os.Remove(filepath.Join(a.mnt, "p", "incoming", "f")) // the receipt, or the failed file
	}
	scratch, _ := filepath.Glob(filepath.Join(a.dm.Cmd.Args[2], "scratch", "*"))
	if len(scratch) != 0 {
		t.Fatalf("A's scratch directory holds %v", scratch)
	}
	t.Logf("%d closes failed, %d published, of %d cut mid-close", failed, published, rounds)
	clitest.StopDaemon(t, a.dm)
	clitest.StopDaemon(t, b.dm)
}

// TestKillSweepLeaseHolder: A sweeps a window of thousands of dead blobs
// and is killed (-9) in the middle of its delete batches. B takes the
// lease within a bounded time, and its report counts exactly what A left:
// every remaining candidate deleted, with their bytes; the report after
// it deletes nothing.
func TestKillSweepLeaseHolder(t *testing.T) {
	// Not parallel: it bounds how long the lease takes to pass.
	clitest.RequireFUSE(t)
	n := 5000
	if os.Getenv("ALKBLOBFS_LONG") == "1" {
		n = 50000
	}
	dsn := pgtest.DSN(t)
	c := clitest.NewCLI(t, fleetFlags(t, dsn, "pglo", nil)...)
	c.OK("ns", "create", "p")
	a, b := startSkewHost(t, "A", "", dsn, "pglo"), startSkewHost(t, "B", "", dsn, "pglo")
	db, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())
	// Dead blobs, written straight into the kv table: no namespace links
	// them.
	ds, vs, sz := make([][]byte, n), make([][]byte, n), make([]int64, n)
	for i := range n {
		v := clitest.RandomBytes(64+i%64, uint64(i))
		h := sha256.Sum256(v)
		ds[i], vs[i], sz[i] = h[:], v, int64(len(v))
	}
	if _, err := db.Exec(t.Context(), `INSERT INTO blobs (digest, size, value) SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::bytea[])`, ds, sz, vs); err != nil {
		t.Fatal(err)
	}
	if rep := c.SweepJSON(); int(rep["candidates_queued"].(float64)) != n {
		t.Fatalf("the staging sweep: %v; want %d candidates", rep, n)
	}
	count := func() (blobs, window int, bytes int64) {
		if err := db.QueryRow(t.Context(), `SELECT (SELECT count(*) FROM blobs), (SELECT count(*) FROM gc_window),
			(SELECT coalesce(sum(size), 0) FROM blobs)`).Scan(&blobs, &window, &bytes); err != nil {
			t.Fatal(err)
		}
		return
	}

	go os.WriteFile(filepath.Join(a.mnt, ".alkblobfs", "sweep"), []byte("run\n"), 0o644) // ends with A
	clitest.Eventually(t, 30*time.Second, "A's sweep to start deleting", func() bool {
		left, _, _ := count()
		return left < n
	})
	a.dm.Cmd.Process.Signal(syscall.SIGKILL)
	killed := time.Now()
	a.dm.Wait(10 * time.Second)
	blobs, window, bytes := count()
	t.Logf("A killed with %d of %d candidates left (%d in the window)", blobs, n, window)
	if blobs != window {
		t.Fatalf("after the kill: %d blobs but %d window candidates; every blob here is a candidate", blobs, window)
	}

	var rep map[string]any
	clitest.Eventually(t, 10*time.Second, "B to take the sweep lease", func() bool {
		rep, _ = b.sweep(t)
		return rep["aborted"] == nil
	})
	t.Logf("B took the lease %s after the kill", time.Since(killed).Round(time.Millisecond))
	if got := int(rep["deleted"].(float64)); got != blobs {
		t.Fatalf("B's report: %d deleted; %d were left", got, blobs)
	}
	if got := int64(rep["bytes_freed"].(float64)); got != bytes {
		t.Fatalf("B's report: %d bytes freed; the %d left held %d", got, blobs, bytes)
	}
	if got := int(rep["cancelled_by_arbitration"].(float64)); got != 0 {
		t.Fatalf("B's report: %d cancelled; nothing protected them", got)
	}
	if left, w, _ := count(); left != 0 || w != 0 {
		t.Fatalf("after B's sweep: %d blobs, %d window rows", left, w)
	}
	rep, _ = b.sweep(t)
	if rep["deleted"].(float64) != 0 || rep["candidates_queued"].(float64) != 0 {
		t.Fatalf("the sweep after: %v; want nothing to do", rep)
	}
	clitest.StopDaemon(t, b.dm)
}
