//go:build linux

package fleet

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/engines/s3"
	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
	"github.com/jackc/pgx/v5"
)

// TestFleetAcceptance is the fleet's acceptance test: three fleet mounts
// (A, B, C) on one PostgreSQL, each through a fault proxy of its own, and
// one S3 large tier; A's clock runs 5 minutes fast, C's 5 minutes slow, the
// CLI's 5 minutes fast, B's is right. Under a steady load — a writer per
// host copying small (kv-tier) and large (S3) files into incoming/ of
// three namespaces, a loop on C that puts and rm's links, sweeps on B's
// timer, through A's and C's control files and from the CLI — the faults
// come in turn:
//
//  1. A is blackholed for twice the pin TTL while B sweeps, then restored;
//     files held open on B and C (unlinked) survive it.
//  2. C's proxy resets in the middle of the close of a large file: the
//     close fails or the file is published whole.
//  3. B, holding the sweep lease in the middle of its delete batches of
//     thousands of dead blobs, is killed (-9); A takes the lease within a
//     bound and its report counts exactly what B left; B is mounted again
//     on the same mountpoint. Files held open on A and C survive it.
//  4. An rm on A shows on B (listing and stat) within a second.
//
// At the end: every copy whose close returned 0 is listed on every host;
// no namespace link names a missing blob; every linked blob reads back
// through every host with the sha256 of its name; the files held open on
// C since the start read whole; once every holder is gone, a sweep pair
// leaves only linked blobs, within TTL + window; no stage is left on S3 and
// no pending row in PostgreSQL.
//
// The per-process skews make the row clock the guard: on the hosts'
// clocks, the CLI's and A's sweeps would take C's pins for lapsed at once.
// One round of faults here (about 30 s); ALKBLOBFS_LONG=1: four rounds,
// more writers' files and a larger kill batch.
func TestFleetAcceptance(t *testing.T) {
	// Not parallel: it bounds how long the fleet takes (cut hosts, collection after the release).
	clitest.RequireFUSE(t)
	rounds, dead, closes, props := 1, 3000, 2, 5
	if os.Getenv("ALKBLOBFS_LONG") == "1" {
		rounds, dead, closes, props = 4, 20000, 6, 25
	}
	start := time.Now()
	dsn, large := pgtest.DSN(t), s3test.URL(t)
	c := clitest.NewCLI(t, fleetFlags(t, dsn, large, nil)...)
	c.Env = []string{clockSkewEnv + "=+5m"} // the CLI's
	nss := []string{"n0", "n1", "n2"}
	c.OK(append([]string{"ns", "create", "hold", "g", "mc", "prop"}, nss...)...)
	db, err := pgx.Connect(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(context.Background())

	a := startSkewHost(t, "A", "+5m", dsn, large)
	b := startSkewHost(t, "B", "", dsn, large, "--sweep-every", "1s")
	cc := startSkewHost(t, "C", "-5m", dsn, large)
	hosts := []*skewHost{a, b, cc}

	// put puts a fresh file of n bytes into ns through the CLI.
	seed := uint64(1000)
	put := func(ns string, n int) string {
		seed++
		src := filepath.Join(t.TempDir(), "f")
		if err := os.WriteFile(src, clitest.RandomBytes(n, seed), 0o644); err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(c.OK("put", "--ns", ns, src))
	}
	// holdOn holds fresh blobs open on h — large ones (S3) and one under
	// the threshold (kv) — and unlinks them: h's pins alone keep them.
	holdOn := func(h *skewHost) []*heldFile {
		var hs []*heldFile
		for _, n := range []int{1 << 20, 3 << 19, 100 << 10} {
			d := put("hold", n)
			hs = append(hs, hold(t, h, "hold", d))
			c.OK("unlink", "hold", d)
		}
		return hs
	}
	// The long-lived holds, on the slow host.
	heldC := holdOn(cc)

	logs := t.TempDir()
	var (
		load     []*loop
		cliStop  chan struct{}
		cliDone  sync.WaitGroup
		cliMu    sync.Mutex
		cliTally sweepTally
	)
	loadOn := func() {
		for _, h := range hosts {
			// The digest of each copy whose close returned 0 goes to the
			// log (cp, not a shell redirection, which drops the close's
			// error). One file in eight is large (S3).
			tmp := filepath.Join(logs, "src-"+h.name)
			script := fmt.Sprintf(`i=$(date +%%s%%N); while [ ! -e "$STOP" ]; do i=$((i+1)); ns=n$((i %% 3))
				if [ $((i %% 8)) -eq 0 ]; then n=300000; else n=$((200 + i %% 3000)); fi
				{ head -c $n /dev/urandom; echo $i; } > %[1]s
				cp %[1]s %[2]s/$ns/incoming/w%[3]s-$i && echo "$ns $(sha256sum < %[1]s | cut -c1-64)" >> %[4]s/closed-%[3]s
				sleep 0.03; done`, tmp, h.mnt, h.name, logs)
			load = append(load, startLoop(t, "writer on "+h.name, script))
		}
		garbage := filepath.Join(logs, "garbage")
		load = append(load,
			startLoop(t, "rm on C", fmt.Sprintf(`while [ ! -e "$STOP" ]; do { head -c 200000 /dev/urandom; } > %[1]s
				cp %[1]s %[2]s/g/incoming/x && rm -f %[2]s/g/$(sha256sum < %[1]s | cut -c1-64); sleep 0.05; done`, garbage, cc.mnt)),
			startLoop(t, "sweeps on A", fmt.Sprintf(`while [ ! -e "$STOP" ]; do echo run > %s/.alkblobfs/sweep; sleep 0.3; done 2>/dev/null`, a.mnt)),
			startLoop(t, "sweeps on C", fmt.Sprintf(`while [ ! -e "$STOP" ]; do echo run > %s/.alkblobfs/sweep; sleep 0.4; done 2>/dev/null`, cc.mnt)))
		cliStop = make(chan struct{})
		cliDone.Add(1)
		go func() { // CLI sweeps, 5 minutes fast, straight to the server
			defer cliDone.Done()
			for {
				select {
				case <-cliStop:
					return
				case <-time.After(250 * time.Millisecond):
				}
				r, err := c.Exec(nil, "sweep", "--json")
				var rep struct {
					Aborted string `json:"aborted"`
					Queued  int    `json:"candidates_queued"`
					Deleted int    `json:"deleted"`
				}
				cliMu.Lock()
				cliTally.runs++
				if err != nil || r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &rep) != nil {
					cliTally.aborted++ // counted with the aborted: it did nothing
				} else {
					if rep.Aborted != "" {
						cliTally.aborted++
					}
					cliTally.queued += rep.Queued
					cliTally.deleted += rep.Deleted
				}
				cliMu.Unlock()
			}
		}()
	}
	loadOff := func() {
		for _, l := range load {
			l.end(t)
		}
		load = nil
		close(cliStop)
		cliDone.Wait()
	}
	var mustPublish []string // "ns digest": closes in the test that returned 0
	var midCloseFailed, midClosePublished int
	var leaseTaken []time.Duration
	prop := newPropagation(5 * time.Second)
	rng := rand.New(rand.NewPCG(24, 24))

	loadOn()
	for round := range rounds {
		// 1. A cut off for twice the TTL while B sweeps.
		held := append(holdOn(b), holdOn(cc)...)
		a.proxy.Blackhole()
		cut := time.Now()
		var bSweeps, bAborted, bDeleted int
		for time.Since(cut) < 2*cutTTL {
			rep, fresh := b.sweep(t)
			bSweeps++
			if !fresh {
				bAborted++
			} else {
				bDeleted += int(rep["deleted"].(float64))
			}
		}
		a.proxy.Restore()
		t.Logf("round %d: A cut off for %s; meanwhile B swept %d times through its control file (%d aborted: the lease was elsewhere), deleting %d",
			round, time.Since(cut).Round(time.Millisecond), bSweeps, bAborted, bDeleted)
		for _, hf := range held {
			hf.readWhole(t)
		}

		// 2. C's proxy resets in the middle of a large close.
		for i := range closes {
			content := clitest.RandomBytes(2<<20+i, uint64(round*100+i))
			d := clitest.Sum(content)
			f, err := os.Create(cc.path("mc", "incoming", fmt.Sprintf("r%d-%d", round, i)))
			if err != nil {
				t.Fatal(err)
			}
			if _, err := f.Write(content); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- f.Close() }()
			time.Sleep(time.Duration(rng.IntN(80)) * time.Millisecond) // the moment of the cut
			cc.proxy.Reset()
			var cerr error
			select {
			case cerr = <-done:
			case <-time.After(cutBound):
				t.Fatalf("round %d: a close on C, reset, still waiting after %s", round, cutBound)
			}
			cc.proxy.Restore()
			// A close that returned 0 is published once its RELEASE's
			// settle has run, and the kernel sends that RELEASE after the
			// close returns: it may reach C while the proxy still resets
			// (before the Restore above), or join a settle group whose
			// statement the reset cut. The settle then fails and the
			// lease retries it at its next tick (TTL/3). So the listing
			// right after the close may miss it (TestCloseThenSettleCut);
			// only one that never shows is a loss.
			published := slices.Contains(clitest.Lines(c.OK("ls", "mc")), d)
			if cerr == nil && !published {
				late := time.Now()
				for !published && time.Since(late) < 10*time.Second {
					time.Sleep(50 * time.Millisecond) // polling, bounded
					published = slices.Contains(clitest.Lines(c.OK("ls", "mc")), d)
				}
				if !published {
					t.Fatalf("round %d: the close on C returned 0 but %s was not linked within %s; C's log:\n%s", round, d,
						time.Since(late).Round(time.Millisecond), tail(cc.dm.Stderr.String(), 40))
				}
				t.Logf("round %d: the close on C returned 0; %s was linked %s later (its settle was retried)", round, d, time.Since(late).Round(time.Millisecond))
			}
			t.Logf("round %d: C reset mid-close: close = %v, published = %v", round, cerr, published)
			switch {
			case published:
				midClosePublished++
				mustPublish = append(mustPublish, "mc "+d)
				if got := clitest.FileSHA(t, a.path("mc", d)); got != d {
					t.Fatalf("round %d: %s, published by a close cut by a reset, reads back through A as %s", round, d, got)
				}
			default:
				midCloseFailed++
			}
		}

		// 3. kill -9 of B, holding the sweep lease, mid-batch. The load
		// stops so that the next report can be counted exactly.
		loadOff()
		held = holdOn(a)
		if err := os.WriteFile(b.path(".alkblobfs", "sweep-timer"), []byte("off\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		ds, vs, sz := make([][]byte, dead), make([][]byte, dead), make([]int64, dead)
		for i := range dead {
			v := clitest.RandomBytes(64+i%64, uint64(round)<<32|uint64(i))
			h := sha256.Sum256(v)
			ds[i], vs[i], sz[i] = h[:], v, int64(len(v))
		}
		if _, err := db.Exec(t.Context(), `INSERT INTO blobs (digest, size, value) SELECT * FROM unnest($1::bytea[], $2::bigint[], $3::bytea[])`, ds, sz, vs); err != nil {
			t.Fatal(err)
		}
		deadLeft := func() int {
			var n int
			if err := db.QueryRow(t.Context(), `SELECT count(*) FROM blobs WHERE digest = ANY($1)`, ds).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		// The CLI stages them (B's last timer sweep may hold the lease a
		// moment).
		clitest.Eventually(t, 30*time.Second, "the CLI to stage the dead blobs", func() bool {
			rep := cliSweep(c)
			return rep != nil && rep["window_pending"].(float64) >= float64(dead)
		})
		go os.WriteFile(b.path(".alkblobfs", "sweep"), []byte("run\n"), 0o644) // ends with B
		clitest.Eventually(t, 30*time.Second, "B's sweep to start deleting", func() bool { return deadLeft() < dead })
		b.dm.Cmd.Process.Signal(syscall.SIGKILL)
		killed := time.Now()
		b.dm.Wait(15 * time.Second)
		left := deadLeft()
		before := sizes(t, c)
		t.Logf("round %d: B killed mid-batch with %d of %d dead blobs left; the store holds %d blobs", round, left, dead, len(before))
		if left == 0 {
			t.Logf("round %d: B finished its batch before the kill landed", round)
		}
		var rep map[string]any
		clitest.Eventually(t, 15*time.Second, "A to take the sweep lease", func() bool {
			var fresh bool
			rep, fresh = a.sweep(t)
			return fresh
		})
		// When A's sweep began: the report's start is on A's clock, which
		// is 5 minutes off; its duration is not.
		leaseTaken = append(leaseTaken, time.Since(killed)-time.Duration(rep["duration_ns"].(float64)))
		after := sizes(t, c)
		var gone int
		var freed int64
		for d, n := range before {
			if _, ok := after[d]; !ok {
				gone++
				freed += n
			}
		}
		t.Logf("round %d: A took the lease %s after the kill: %v", round, leaseTaken[len(leaseTaken)-1].Round(time.Millisecond), rep)
		if got := int(rep["deleted"].(float64)); got != gone {
			t.Fatalf("round %d: A's report after the kill: %d deleted; %d blobs went", round, got, gone)
		}
		if got := int64(rep["bytes_freed"].(float64)); got != freed {
			t.Fatalf("round %d: A's report after the kill: %d bytes freed; the blobs that went held %d", round, got, freed)
		}
		if n := deadLeft(); n != 0 {
			t.Fatalf("round %d: %d dead blobs left after A's sweep", round, n)
		}
		b.mount(t) // the same mountpoint, recovered
		if _, err := listed(b.path("n0")); err != nil {
			t.Fatalf("round %d: B after its remount: %v", round, err)
		}
		for _, hf := range held {
			hf.readWhole(t)
		}
		loadOn()

		// 4. An rm on A shows on B within a second.
		for i := range props {
			content := []byte(fmt.Sprintf("propagation round %d %d", round, i))
			d := clitest.Sum(content)
			if err := os.WriteFile(a.path("prop", "incoming", fmt.Sprintf("r%d-%d", round, i)), content, 0o644); err != nil {
				t.Fatalf("a put through A: %v", err)
			}
			clitest.Eventually(t, 5*time.Second, "B to show A's put", func() bool {
				ls, fi := look(t, b.path("prop"), d)
				return ls && fi != nil
			})
			if err := unlinkEINTR(a.path("prop", d)); err != nil {
				t.Fatalf("rm through A: %v; A's log:\n%s", err, tail(a.dm.Stderr.String(), 30))
			}
			prop.time(t, "rm", b.path("prop"), d, func(listed bool, fi os.FileInfo) (bool, bool) { return !listed, fi == nil })
		}
	}
	loadOff()
	faultsEnd := time.Since(start)

	// Every close that returned 0 is published, listed on every host.
	for _, h := range hosts {
		out, err := os.ReadFile(filepath.Join(logs, "closed-"+h.name))
		if err != nil {
			t.Fatalf("the writer on %s logged no close: %v", h.name, err)
		}
		mustPublish = append(mustPublish, clitest.Lines(string(out))...)
	}
	var large0 int
	byNS := map[string][]string{}
	for _, l := range mustPublish {
		ns, d, _ := strings.Cut(l, " ")
		byNS[ns] = append(byNS[ns], d)
	}
	for _, h := range hosts {
		for ns, ds := range byNS {
			var got map[string]bool
			clitest.Eventually(t, 10*time.Second, ns+" on "+h.name+" to list every published copy", func() bool {
				var err error
				if got, err = listed(h.path(ns)); err != nil {
					t.Fatalf("ls %s on %s: %v", ns, h.name, err)
				}
				for _, d := range ds {
					if !got[d] {
						return false
					}
				}
				return true
			})
		}
	}

	// No link names a missing blob; every linked blob reads back through
	// every host with its name's sha256.
	store := sizes(t, c)
	linked := map[string]bool{}
	for _, ns := range clitest.Lines(c.OK("ns", "ls")) {
		for _, d := range clitest.Lines(c.OK("ls", ns)) {
			if _, ok := store[d]; !ok {
				t.Fatalf("%s/%s: a link to a blob the store does not hold", ns, d)
			}
			if store[d] >= 128<<10 {
				large0++
			}
			linked[d] = true
			for _, h := range hosts {
				if got := clitest.FileSHA(t, h.path(ns, d)); got != d {
					t.Fatalf("%s/%s reads back through %s as %s", ns, d, h.name, got)
				}
			}
		}
	}
	c.OK("verify")
	for _, hf := range heldC {
		hf.readWhole(t)
	}

	// Nothing unpinned and unlinked outlives TTL + window: a sweep pair
	// after the last holder let go leaves only the linked blobs.
	released := time.Now()
	for {
		cliSweep(c)
		cliSweep(c)
		var lingering []string
		for d := range sizes(t, c) {
			if !linked[d] {
				lingering = append(lingering, d)
			}
		}
		if len(lingering) == 0 {
			break
		}
		if time.Since(released) > cutTTL+15*time.Second {
			t.Fatalf("%s after the last holder let go, %d unlinked blobs are still stored:\n%s",
				time.Since(released).Round(time.Millisecond), len(lingering), whyKept(t, db, hosts, lingering))
		}
		time.Sleep(100 * time.Millisecond) // polling, bounded above
	}
	if took := time.Since(released); took > cutTTL+5*time.Second {
		t.Fatalf("unlinked blobs outlived their last holder by %s; want about the TTL (%s)", took, cutTTL)
	}

	// No stage left on S3, no pending put in PostgreSQL.
	eng, err := s3.OpenURL(t.Context(), large, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	clitest.Eventually(t, 10*time.Second, "no stage residue on S3 and no pending rows", func() bool {
		res, err := eng.StageResidue(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		var pending int
		if err := db.QueryRow(t.Context(), `SELECT count(*) FROM ns_pending`).Scan(&pending); err != nil {
			t.Fatal(err)
		}
		if res != 0 || pending != 0 {
			t.Logf("stage residue %d, pending rows %d", res, pending)
		}
		return res == 0 && pending == 0
	})

	for _, h := range hosts {
		clitest.StopDaemon(t, h.dm)
		got := tallySweeps(h.log())
		t.Logf("%s (skew %q): %s; %d renewals found pin rows no pin accounted for (a row write that failed but committed)",
			h.name, h.skew, got, strings.Count(h.log(), "no pin of this process accounts for"))
		// Every host swept: B on its timer and through its control file,
		// A and C in their loops, A and B in the fault rounds. Its log
		// shows at least the sweeps the test saw run there.
		if got.runs == 0 || got.runs-got.aborted < h.seen.runs || got.deleted < h.seen.deleted {
			t.Errorf("%s's log shows %s; the test saw %d sweeps run there that deleted %d", h.name, got, h.seen.runs, h.seen.deleted)
		}
	}
	t.Logf("CLI (skew +5m): %s", cliTally)
	t.Logf("%d rounds in %s (faults %s): %d copies published (%d linked blobs, %d on S3), %d of %d mid-close resets failed, %d published; lease taken after %v",
		rounds, time.Since(start).Round(time.Millisecond), faultsEnd.Round(time.Millisecond), len(mustPublish), len(linked), large0,
		midCloseFailed, midCloseFailed+midClosePublished, midClosePublished, leaseTaken)
	t.Logf("propagation A -> B:\n%s", prop.table())
	for _, col := range [][]time.Duration{prop.ls["rm"], prop.stat["rm"]} {
		if got := quantile(col, 1); got > time.Second {
			t.Errorf("an rm on A showed on B after %s; want within 1s", got)
		}
	}
}

// whyKept says, for each digest, what the database holds about it: pin
// rows (the owner, named by its host where the owner's pid is a host's
// daemon, and seconds left on the server's clock), pending puts, links and
// the window; then what the hosts' logs say of it.
func whyKept(t *testing.T, db *pgx.Conn, hosts []*skewHost, ds []string) string {
	t.Helper()
	var b strings.Builder
	for _, d := range ds[:min(len(ds), 20)] {
		var pins, pending, refs, window string
		if err := db.QueryRow(t.Context(), `SELECT
			(SELECT coalesce(string_agg(owner || ' ' || round((expiry/1e9 - extract(epoch from clock_timestamp()))::numeric, 1) || 's', ', '), '') FROM gc_pins WHERE digest = decode($1, 'hex')),
			(SELECT coalesce(string_agg(ns || ' ' || holder, ', '), '') FROM ns_pending WHERE digest = decode($1, 'hex')),
			(SELECT coalesce(string_agg(ns, ', '), '') FROM ns_refs WHERE digest = decode($1, 'hex')),
			(SELECT coalesce(string_agg(round((visible_after/1e9 - extract(epoch from clock_timestamp()))::numeric, 1) || 's', ', '), '') FROM gc_window WHERE digest = decode($1, 'hex'))`,
			d).Scan(&pins, &pending, &refs, &window); err != nil {
			t.Fatal(err)
		}
		for _, h := range hosts {
			pins = strings.ReplaceAll(pins, fmt.Sprintf(":%d:", h.dm.Cmd.Process.Pid), fmt.Sprintf(":%d(host %s):", h.dm.Cmd.Process.Pid, h.name))
		}
		fmt.Fprintf(&b, "%s: pins [%s] pending [%s] links [%s] window [%s]\n", d[:12], pins, pending, refs, window)
		for _, h := range hosts {
			for _, l := range clitest.Lines(h.log()) {
				if strings.Contains(l, d) {
					fmt.Fprintf(&b, "\t%s: %s\n", h.name, l)
				}
			}
		}
	}
	return b.String()
}

// tail is the last n lines of s.
func tail(s string, n int) string {
	l := strings.Split(strings.TrimSuffix(s, "\n"), "\n")
	return strings.Join(l[max(0, len(l)-n):], "\n")
}

// cliSweep runs a sweep through the CLI and returns its report, or nil if
// it was aborted (another process held the lease).
func cliSweep(c *clitest.CLI) map[string]any {
	c.T.Helper()
	var rep map[string]any
	if err := json.Unmarshal([]byte(c.OK("sweep", "--json")), &rep); err != nil {
		c.T.Fatal(err)
	}
	if rep["aborted"] != nil {
		return nil
	}
	return rep
}

// sizes is the store's `ls -l`: every blob it holds, with its size.
func sizes(t *testing.T, c *clitest.CLI) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, l := range clitest.Lines(c.OK("ls", "-l")) {
		d, n, ok := strings.Cut(l, " ")
		v, err := strconv.ParseInt(n, 10, 64)
		if !ok || err != nil {
			t.Fatalf("ls -l: %q", l)
		}
		out[d] = v
	}
	return out
}
