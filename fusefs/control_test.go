//go:build linux

package fusefs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
	"github.com/alkblobfs/alkblobfs/upkeep"
)

func writeCtl(path, s string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(s)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

func readCtl(t *testing.T, path string) string {
	t.Helper()
	return string(mustRead(t, path))
}

func TestControlFiles(t *testing.T) {
	for _, spec := range storeSpecs {
		t.Run(spec.name, func(t *testing.T) { testControlFiles(t, spec) })
	}
}

func testControlFiles(t *testing.T, spec storeSpec) {
	e := mountStore(t, spec)
	ctl := e.path(controlName)

	t.Run("sweep", func(t *testing.T) {
		if got := strings.TrimSpace(readCtl(t, ctl+"/sweep")); got != "{}" {
			t.Fatalf("sweep before any sweep: %q", got)
		}
		// Through a shell, as an operator would.
		sh(t, "echo run > "+ctl+"/sweep")
		var rep struct {
			Scanned *int64 `json:"scanned"`
			Aborted string `json:"aborted"`
		}
		if err := json.Unmarshal(mustRead(t, ctl+"/sweep"), &rep); err != nil || rep.Scanned == nil {
			t.Fatalf("sweep report: %v: %s", err, readCtl(t, ctl+"/sweep"))
		}
		if rep.Aborted != "" {
			t.Fatalf("sweep aborted: %s", rep.Aborted)
		}
		wantErrno(t, "bad sweep command", writeCtl(ctl+"/sweep", "walk\n"), syscall.EINVAL)
	})
	t.Run("sweep-timer", func(t *testing.T) {
		timer := ctl + "/sweep-timer"
		read := func() string { return strings.TrimSpace(readCtl(t, timer)) }
		if got := read(); got != "off" {
			t.Fatalf("timer starts %q", got)
		}
		for _, c := range []struct{ in, want string }{
			{"5m", "5m0s"}, {"off", "off"}, {"on", "5m0s"}, {"90s\n", "1m30s"}, {"off\n", "off"}, {"on", "1m30s"},
		} {
			if err := writeCtl(timer, c.in); err != nil {
				t.Fatalf("write %q: %v", c.in, err)
			}
			if got := read(); got != c.want {
				t.Fatalf("after %q: %q, want %q", c.in, got, c.want)
			}
		}
		for _, bad := range []string{"banana", "-1s", "5", "on off", "1ns", "999ms", "0", "0s"} {
			wantErrno(t, "timer "+bad, writeCtl(timer, bad), syscall.EINVAL)
			if got := read(); got != "1m30s" {
				t.Fatalf("bad input %q changed the timer to %q", bad, got)
			}
		}
		// The timer sweeps through the same path as the control file.
		before := e.srv.Stats(context.Background()).Sweeps
		if err := writeCtl(timer, "1s"); err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, "a timer sweep", func() bool {
			return e.srv.Stats(context.Background()).Sweeps >= before+2
		})
		if err := writeCtl(timer, "off"); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("stats", func(t *testing.T) {
		var s Stats
		if err := json.Unmarshal(mustRead(t, ctl+"/stats"), &s); err != nil {
			t.Fatal(err)
		}
		if s.Verify != VerifyFull || s.Store.Mode == "" || s.SweepTimer != "off" || s.LastSweep == nil {
			t.Fatalf("stats: %+v", s)
		}
		_, err := os.OpenFile(ctl+"/stats", os.O_WRONLY, 0)
		wantErrno(t, "open stats for writing", err, syscall.EACCES)
	})
	t.Run("control directory is fixed", func(t *testing.T) {
		_, err := os.Create(ctl + "/new")
		wantErrno(t, "create", err, syscall.EPERM)
		wantErrno(t, "unlink", os.Remove(ctl+"/stats"), syscall.EPERM)
		wantErrno(t, "rmdir", syscall.Rmdir(ctl), syscall.EPERM)
	})
}

// TestControlInputStrict: a control file takes exactly one command, in
// one write: off, on or a duration of at least 1s for the timer, run for
// sweep and scrub, each with at most one trailing newline (echo's). What a
// slip of the shell writes — 0, a truncation, two lines — must not turn
// GC off or set some other value: it is EINVAL and changes nothing, and an
// open with O_TRUNC or a truncate alone is no command at all.
func TestControlInputStrict(t *testing.T) {
	e := mountStore(t, memSpec)
	ctl := e.path(controlName)
	timer := ctl + "/sweep-timer"
	read := func() string { t.Helper(); return strings.TrimSpace(readCtl(t, timer)) }

	// on before any interval was set starts the default.
	if err := writeCtl(timer, "on\n"); err != nil {
		t.Fatal(err)
	}
	if got := read(); got != upkeep.DefaultSweepInterval.String() {
		t.Fatalf("on with no earlier interval: %q, want %s", got, upkeep.DefaultSweepInterval)
	}
	if err := writeCtl(timer, "30m"); err != nil {
		t.Fatal(err)
	}
	const want = "30m0s"

	// Through a shell, as an operator types them.
	for _, c := range []struct {
		script string
		ok     bool
	}{
		{": > " + timer, true},
		{"truncate -s 0 " + timer, true},
		{"echo 0 > " + timer, false},
		{"echo 0s > " + timer, false},
		{"echo > " + timer, false},
		{`printf '1h\n2h' > ` + timer, false},
		{`printf 'on\noff\n' > ` + timer, false},
		{"{ echo 1h; echo 2h; } > " + timer, false},
	} {
		out, err := exec.Command("bash", "-c", c.script).CombinedOutput()
		if (err == nil) != c.ok {
			t.Errorf("%s: %v %s; want ok=%v", c.script, err, out, c.ok)
		}
		if !c.ok && !strings.Contains(string(out), "Invalid argument") {
			t.Errorf("%s: %s; want EINVAL", c.script, out)
		}
		if got := read(); got != want {
			t.Fatalf("%s changed the timer to %q; want %s", c.script, got, want)
		}
	}

	// One write(2) each.
	for _, bad := range []string{"0", "0s", "0\n", "\n", " ", "1h\n2h", "1h\n\n", " 1h", "1h ", "1h\r\n", "\t1h\n",
		"ON", "on\n\n", " off", "off\x00", "run"} {
		wantErrno(t, fmt.Sprintf("timer %q", bad), writeCtl(timer, bad), syscall.EINVAL)
		if got := read(); got != want {
			t.Fatalf("bad input %q changed the timer to %q", bad, got)
		}
	}
	// A write of nothing is no command either.
	f, err := os.OpenFile(timer, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := syscall.Write(int(f.Fd()), nil); err != nil {
		t.Errorf("an empty write: %v", err)
	}
	f.Close()
	if got := read(); got != want {
		t.Fatalf("an empty write changed the timer to %q", got)
	}
	sh(t, "echo 1h > "+timer)
	if got := read(); got != "1h0m0s" {
		t.Fatalf("echo 1h: %q", got)
	}
	// A command that failed did nothing, so the same open may send one
	// again: a write interrupted by a signal (EINTR) is retried so.
	f, err = os.OpenFile(timer, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.Write([]byte("junk"))
	wantErrno(t, "a bad command", err, syscall.EINVAL)
	if _, err := f.Write([]byte("2h\n")); err != nil {
		t.Errorf("a command after a failed one, on the same open: %v", err)
	}
	f.Close()
	if got := read(); got != "2h0m0s" {
		t.Fatalf("after junk then 2h on one open: %q", got)
	}

	for _, name := range []string{"sweep", "scrub"} {
		p := ctl + "/" + name
		for _, bad := range []string{"", " run", "run ", "run\n\n", "RUN", "run\r\n", "\n", "run\nrun"} {
			if bad == "" {
				continue // no write(2): nothing to refuse
			}
			wantErrno(t, fmt.Sprintf("%s %q", name, bad), writeCtl(p, bad), syscall.EINVAL)
		}
		for _, script := range []string{`printf 'run\nrun' > ` + p, "echo > " + p} {
			if out, err := exec.Command("bash", "-c", script).CombinedOutput(); err == nil {
				t.Errorf("%s: accepted (%s)", script, out)
			}
		}
		sh(t, ": > "+p)
		sh(t, "echo run > "+p)
		if err := writeCtl(p, "run"); err != nil {
			t.Errorf("%s run: %v", name, err)
		}
	}
}

// TestSweepWhileOpen: an open file survives a sweep after its last
// reference went; once closed, two sweeps (stage, then execute) remove it.
func TestSweepWhileOpen(t *testing.T) {
	for _, spec := range storeSpecs {
		t.Run(spec.name, func(t *testing.T) { testSweepWhileOpen(t, spec) })
	}
}

func testSweepWhileOpen(t *testing.T, spec storeSpec) {
	e := mountStore(t, spec)
	e.mkns("g")
	ctx := context.Background()
	content := randBytes(12, 1<<20)
	d := e.put("g", content)
	p := e.path("g", d.String())
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(p); err != nil {
		t.Fatal(err)
	}
	sweep := func() {
		t.Helper()
		if err := writeCtl(e.path(controlName, "sweep"), "run"); err != nil {
			t.Fatal(err)
		}
	}
	sweep()
	sweep()
	if ok, _ := e.st.Has(ctx, d); !ok {
		t.Fatal("open blob swept")
	}
	got, err := io.ReadAll(f)
	if err != nil || sum(got) != d.String() {
		t.Fatalf("read after sweeps: %v", err)
	}
	f.Close()
	// The handle's pin and open reference go with the RELEASE, which the
	// kernel sends after close returns.
	eventually(t, 30*time.Second, "the handle's release", func() bool {
		return e.srv.Stats(ctx).OpenHandles == 0
	})
	sweep()
	sweep()
	if ok, _ := e.st.Has(ctx, d); ok {
		t.Fatal("closed, unreferenced blob survived two sweeps")
	}
}

// TestReceipts: the incoming name stays readable after publish, takes
// attribute changes, expires after the TTL, and rm removes it early
// without touching the published blob.
//
// The TTL is 2 s: everything before the expiry must happen within it,
// eight requests of the mount that a loaded machine has taken over 1.5 s
// to answer (with 300 ms, drop had expired before its rm).
func TestReceipts(t *testing.T) {
	const ttl = 2 * time.Second
	e := mountStore(t, defaultSpec, withReceiptTTL(ttl))
	e.mkns("r")
	in := e.path("r", "incoming")
	content := randBytes(13, 500<<10)
	start := time.Now()
	writeFile(t, in+"/keep", content)
	writeFile(t, in+"/drop", []byte("drop me"))
	if got := fileSum(t, in+"/keep"); got != sum(content) {
		t.Fatalf("receipt reads %s", got)
	}
	if err := os.Chmod(in+"/keep", 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(in+"/keep", 1234, 5678); err != nil {
		t.Fatal(err)
	}
	mt := time.Date(2001, 2, 3, 4, 5, 6, 0, time.UTC)
	if err := os.Chtimes(in+"/keep", mt, mt); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(in + "/keep")
	if err != nil || fi.Mode().Perm() != 0o600 || !fi.ModTime().Equal(mt) || fi.Size() != int64(len(content)) {
		t.Fatalf("receipt attributes: %v %v %v %v", err, fi.Mode(), fi.ModTime(), fi.Size())
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1234 || st.Gid != 5678 {
		t.Fatalf("chown not kept: %d:%d", st.Uid, st.Gid)
	}
	if err := os.Remove(in + "/drop"); err != nil {
		t.Fatalf("%v (%s after the receipts were written, with a TTL of %s)", err, time.Since(start).Round(time.Millisecond), ttl)
	}
	e.expectNS(t, "r", []string{sum(content), sum([]byte("drop me"))})
	eventually(t, 10*ttl, "the receipt to expire", func() bool {
		_, err := os.Stat(in + "/keep")
		return errors.Is(err, fs.ErrNotExist)
	})
	e.expectNS(t, "r", []string{sum(content), sum([]byte("drop me"))})
	if ents, _ := os.ReadDir(in); len(ents) != 0 {
		t.Fatalf("incoming/ not empty after expiry: %v", ents)
	}
}

// TestReceiptOfSweptBlob: a receipt whose blob a sweep has taken (after
// its namespace dropped it) disappears from incoming/ — from a listing and
// from a lookup — instead of listing a file that reads ENOENT.
func TestReceiptOfSweptBlob(t *testing.T) {
	e := mountStore(t, defaultSpec)
	e.mkns("s")
	in := e.path("s", "incoming")
	for _, name := range []string{"listed", "looked-up", "kept"} {
		writeFile(t, filepath.Join(in, name), []byte("content of "+name))
	}
	for _, name := range []string{"listed", "looked-up"} {
		if err := os.Remove(e.path("s", sum([]byte("content of "+name)))); err != nil {
			t.Fatal(err)
		}
	}
	for range 2 {
		if err := os.WriteFile(e.path(".alkblobfs", "sweep"), []byte("run\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if ok, _ := e.st.Has(t.Context(), blob.Sum([]byte("content of listed"))); ok {
		t.Fatal("the sweeps did not take the unlinked blob")
	}
	// The directory's entries may be cached for its one-second timeout.
	eventually(t, 5*time.Second, "the swept receipt to leave the lookup", func() bool {
		_, err := os.Stat(filepath.Join(in, "looked-up"))
		return errors.Is(err, fs.ErrNotExist)
	})
	eventually(t, 5*time.Second, "the swept receipts to leave the listing", func() bool {
		ents, err := os.ReadDir(in)
		return err == nil && len(ents) == 1 && ents[0].Name() == "kept"
	})
	if got := fileSum(t, filepath.Join(in, "kept")); got != sum([]byte("content of kept")) {
		t.Fatalf("the kept receipt reads %s", got)
	}
}

// TestRootListsManyNamespaces: the root streams its namespaces a page at a
// time; every one of more than two pages lists, in byte order, after the
// control directory, with ls -l's per-entry lookups answered.
func TestRootListsManyNamespaces(t *testing.T) {
	t.Parallel() // lists only (see TestMain)
	e := mountStore(t, defaultSpec)
	var want []string
	for i := range 2500 {
		name := fmt.Sprintf("ns-%05d", i)
		if err := e.reg.Create(t.Context(), name); err != nil {
			t.Fatal(err)
		}
		want = append(want, name)
	}
	ents, err := os.ReadDir(e.mnt) // sorted by os.ReadDir; the order check is below
	if err != nil {
		t.Fatal(err)
	}
	if len(ents) != len(want)+1 {
		t.Fatalf("the root lists %d names; want %d namespaces and .alkblobfs", len(ents), len(want))
	}
	out, err := exec.Command("ls", "-l", "-f", e.mnt).Output() // -f: directory order, no sort
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && strings.HasPrefix(f[len(f)-1], "ns-") {
			got = append(got, f[len(f)-1])
		}
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ls -l -f lists %d namespaces (first %v); want %d in byte order", len(got), got[:min(3, len(got))], len(want))
	}
}

// TestEmptyIncomingDirsExpire: directories under incoming/ go a TTL after
// they are found empty, nested ones too (the parent once its child went),
// like receipts. The TTL (1 s) leaves a loaded machine time to make b
// before a, found empty, expires.
func TestEmptyIncomingDirsExpire(t *testing.T) {
	e := mountStore(t, defaultSpec, withReceiptTTL(time.Second))
	e.mkns("d")
	in := e.path("d", "incoming")
	if err := os.MkdirAll(filepath.Join(in, "a", "b"), 0o755); err != nil {
		t.Fatal(err)
	}
	eventually(t, 10*time.Second, "the empty directories to expire", func() bool {
		_, err := os.Stat(filepath.Join(in, "a"))
		return errors.Is(err, fs.ErrNotExist)
	})
	if ents, err := os.ReadDir(in); err != nil || len(ents) != 0 {
		t.Fatalf("incoming/ after the expiry: %v, %v", ents, err)
	}
}

// TestReceiptCap: past the cap, the oldest receipts go before their TTL;
// every file is published all the same.
func TestReceiptCap(t *testing.T) {
	e := mountStore(t, defaultSpec, withMaxReceipts(5))
	e.mkns("c")
	in := e.path("c", "incoming")
	var want []string
	for i := range 20 {
		b := []byte(fmt.Sprintf("file %d", i))
		writeFile(t, filepath.Join(in, fmt.Sprintf("f%02d", i)), b)
		want = append(want, sum(b))
	}
	eventually(t, 10*time.Second, "the receipts to fall to the cap", func() bool {
		ents, err := os.ReadDir(in)
		return err == nil && len(ents) <= 5
	})
	ents, _ := os.ReadDir(in)
	for _, en := range ents {
		if en.Name() < "f15" {
			t.Errorf("an old receipt %s stayed while newer ones went", en.Name())
		}
	}
	slices.Sort(want)
	e.expectNS(t, "c", want)
}

// TestListingRewinds: a listing read part way and rewound (rewinddir)
// lists everything again, at the root and in a namespace, whose offsets
// are entry ordinals.
func TestListingRewinds(t *testing.T) {
	e := mountStore(t, defaultSpec)
	e.mkns("w")
	for i := range 30 {
		e.put("w", []byte(fmt.Sprintf("blob %d", i)))
		if err := e.reg.Create(t.Context(), fmt.Sprintf("n%02d", i)); err != nil {
			t.Fatal(err)
		}
	}
	for dir, want := range map[string]int{e.mnt: 32, e.path("w"): 31} { // .alkblobfs, w, n00…n29; incoming, 30 blobs
		f, err := os.Open(dir)
		if err != nil {
			t.Fatal(err)
		}
		first, err := f.ReadDir(7)
		if err != nil || len(first) != 7 {
			t.Fatalf("%s: first 7 entries: %d, %v", dir, len(first), err)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		all, err := f.ReadDir(-1)
		f.Close()
		if err != nil || len(all) != want {
			t.Fatalf("%s after rewinding: %d entries, %v; want %d", dir, len(all), err, want)
		}
		if all[0].Name() != first[0].Name() {
			t.Fatalf("%s: the rewound listing starts at %s, not %s", dir, all[0].Name(), first[0].Name())
		}
	}
}

// TestSweepEveryChecked: the mount itself refuses a sweep timer below the
// minimum and any timer on a read-only mount, whoever configures it.
func TestSweepEveryChecked(t *testing.T) {
	st, err := store.Open(context.Background(), memSpec.open(t, t.TempDir()))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, tc := range []struct {
		every time.Duration
		ro    bool
		ok    bool
	}{{0, false, true}, {0, true, true}, {time.Second, false, true}, {time.Hour, true, false},
		{time.Millisecond, false, false}, {-time.Second, false, false}} {
		_, err := newFS(Config{Store: st, Namespaces: namespaces.NewMem(nil), SweepEvery: tc.every, ReadOnly: tc.ro})
		if (err == nil) != tc.ok {
			t.Errorf("sweep every %s, read-only %v: %v; want ok=%v", tc.every, tc.ro, err, tc.ok)
		}
	}
}
