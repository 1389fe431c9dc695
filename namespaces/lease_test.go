//go:build linux

package namespaces_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// leaseRegistries are the registries a lease is tested over: rows in
// memory, in SQLite and in PostgreSQL.
var leaseRegistries = []struct {
	name string
	open func(t *testing.T) namespaces.Registry
}{
	{"mem", func(t *testing.T) namespaces.Registry { return namespaces.NewMem(nil) }},
	{"sqlite", func(t *testing.T) namespaces.Registry {
		e, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "kv.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		r, err := namespaces.OpenSQL(t.Context(), e, nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}},
	{"postgres", func(t *testing.T) namespaces.Registry {
		r, _ := openPostgres(t, pgtest.DSN(t), nil)
		return r
	}},
}

// leaseEnv is one registry with a namespace, and a lock directory.
type leaseEnv struct {
	t    *testing.T
	reg  namespaces.Registry
	dir  string // the lease lock directory
	host string
}

func newLeaseEnv(t *testing.T, open func(*testing.T) namespaces.Registry) *leaseEnv {
	reg := open(t)
	if err := reg.Create(t.Context(), "ns"); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Hostname()
	return &leaseEnv{t: t, reg: reg, dir: filepath.Join(t.TempDir(), "leases"), host: host}
}

// open opens a life of writer "test:w" with ttl.
func (e *leaseEnv) open(ttl time.Duration) *namespaces.Lease {
	e.t.Helper()
	l, err := namespaces.OpenLease(e.t.Context(), namespaces.LeaseConfig{Registry: e.reg, Name: "test:w", TTL: ttl, LockDir: e.dir,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { l.Close() })
	return l
}

// pend records an intent for a new digest under holder, lapsing in an
// hour (so that no lapse settles it during a test), and returns the digest.
func (e *leaseEnv) pend(holder string) blob.Digest {
	e.t.Helper()
	d := blob.Sum([]byte(holder + time.Now().String()))
	if _, err := e.reg.Pend(e.t.Context(), "ns", d, namespaces.Pending{Holder: holder, TTL: time.Hour}); err != nil {
		e.t.Fatal(err)
	}
	return d
}

func (e *leaseEnv) linked(d blob.Digest) bool {
	e.t.Helper()
	_, ok, err := e.reg.Has(e.t.Context(), "ns", d)
	if err != nil {
		e.t.Fatal(err)
	}
	return ok
}

// holder is the name a life of writer "test:w" with pid and id records
// its intents under (see namespaces.Lease).
func (e *leaseEnv) holder(pid int, id string) string {
	return "test:w:" + e.host + ":" + strconv.Itoa(pid) + ":" + id
}

func (e *leaseEnv) lockFile(id string) string { return filepath.Join(e.dir, id+".lock") }

func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// startProcess starts a command that lives until the test ends.
func startProcess(t *testing.T, name string, arg ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, arg...)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	return cmd
}

// locked reports whether path is flocked by someone.
func locked(t *testing.T, path string) bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	return syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil
}

func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLeaseRecoveryIgnoresReusedPID: a dead life of the writer whose pid
// now belongs to another live process (sleep) is recovered when the next
// life opens: its close-returned-0 links are published. Its lock file was
// left by a real process that held the lock and exited (flock(1)); a
// second dead life, whose lock file is gone (a reboot emptied the runtime
// directory), is recovered too, and so are their lock files.
func TestLeaseRecoveryIgnoresReusedPID(t *testing.T) {
	for _, rc := range leaseRegistries {
		t.Run(rc.name, func(t *testing.T) {
			e := newLeaseEnv(t, rc.open)
			if err := os.MkdirAll(e.dir, 0o700); err != nil {
				t.Fatal(err)
			}
			dead, gone := newID(), newID()
			if out, err := exec.Command("flock", e.lockFile(dead), "true").CombinedOutput(); err != nil {
				t.Fatalf("flock: %v: %s", err, out)
			}
			other := startProcess(t, "sleep", "60")
			if err := syscall.Kill(other.Process.Pid, 0); err != nil {
				t.Fatalf("sleep is not running: %v", err)
			}
			d1 := e.pend(e.holder(other.Process.Pid, dead))
			d2 := e.pend(e.holder(other.Process.Pid, gone))
			if e.linked(d1) || e.linked(d2) {
				t.Fatal("an intent is linked before anyone settled it")
			}

			e.open(time.Hour)
			if !e.linked(d1) {
				t.Errorf("a dead life whose pid %d another process now has is not recovered: its intent is not linked", other.Process.Pid)
			}
			if !e.linked(d2) {
				t.Errorf("a dead life whose lock file is gone is not recovered")
			}
			if _, err := os.Stat(e.lockFile(dead)); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the recovered life's lock file is left: %v", err)
			}
		})
	}
}

// TestLeaseNeverRecoversLiveHolder: a life whose lock a real second
// process holds (flock(1), as a lazily detached mount's daemon would) is
// never recovered, by a new life at its open nor by its loop, whatever
// its pid; once that process dies, the loop recovers it.
func TestLeaseNeverRecoversLiveHolder(t *testing.T) {
	for _, rc := range leaseRegistries {
		t.Run(rc.name, func(t *testing.T) {
			e := newLeaseEnv(t, rc.open)
			if err := os.MkdirAll(e.dir, 0o700); err != nil {
				t.Fatal(err)
			}
			id := newID()
			// -o: the lock is flock(1)'s own, not inherited by sleep.
			holder := startProcess(t, "flock", "-o", e.lockFile(id), "sleep", "60")
			waitFor(t, 10*time.Second, "flock(1) never took the lock", func() bool { return locked(t, e.lockFile(id)) })
			// A pid that is not the holder's: a live holder is live
			// whatever its row says.
			d := e.pend(e.holder(1, id))

			l := e.open(30 * time.Millisecond) // its loop ticks every 10ms
			if e.linked(d) {
				t.Fatal("a new life recovered a live holder's intent at its open")
			}
			// Another life opened after the first one's loop has run
			// several times: it too leaves the live holder alone, and so
			// has the loop.
			ticked(t, e, l)
			e.open(time.Hour)
			if e.linked(d) {
				t.Fatal("a lease's loop, or another life's open, recovered a live holder's intent")
			}

			holder.Process.Kill()
			holder.Wait()
			waitFor(t, 10*time.Second, "the loop never recovered the holder whose process died", func() bool { return e.linked(d) })
		})
	}
}

// ticked waits until l's loop has run a whole tick: it removes l's lock
// file, which the next tick makes again, twice.
func ticked(t *testing.T, e *leaseEnv, l *namespaces.Lease) {
	t.Helper()
	id := l.Holder()[strings.LastIndexByte(l.Holder(), ':')+1:]
	for range 2 {
		if err := os.Remove(e.lockFile(id)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "the lease's loop never ran", func() bool { return locked(t, e.lockFile(id)) })
	}
}

// TestLeaseTwoLivesInOneProcess: two lives of one writer in one process
// (two mounts of one mountpoint: a lazily detached one still serving,
// and its successor) keep their own intents; each settles its own at
// Close, and a life closed with intents left is recovered by the next.
func TestLeaseTwoLivesInOneProcess(t *testing.T) {
	for _, rc := range leaseRegistries {
		t.Run(rc.name, func(t *testing.T) {
			e := newLeaseEnv(t, rc.open)
			a := e.open(time.Hour)
			d := e.pend(a.Holder())
			b := e.open(time.Hour)
			if a.Holder() == b.Holder() {
				t.Fatalf("two lives share the holder %s", a.Holder())
			}
			if e.linked(d) {
				t.Fatal("a second life of the writer settled the first one's live intent")
			}
			if !strings.HasPrefix(a.Holder(), "test:w:"+e.host+":"+strconv.Itoa(os.Getpid())+":") {
				t.Errorf("holder %q does not name the writer, the host and the pid", a.Holder())
			}
			if err := a.Close(); err != nil {
				t.Fatal(err)
			}
			if !e.linked(d) {
				t.Fatal("Close did not settle the lease's open intent")
			}
			ents, _ := os.ReadDir(e.dir)
			if len(ents) != 1 {
				t.Errorf("after one of two lives closed, the lock directory holds %d files; want the live one's", len(ents))
			}
		})
	}
}

// TestLeaseLockFileRemoved: a live lease whose lock file someone removes
// makes it again at its next tick, and so stays live for other lives.
func TestLeaseLockFileRemoved(t *testing.T) {
	e := newLeaseEnv(t, leaseRegistries[0].open)
	l := e.open(30 * time.Millisecond)
	d := e.pend(l.Holder())
	id := l.Holder()[strings.LastIndexByte(l.Holder(), ':')+1:]
	if !locked(t, e.lockFile(id)) {
		t.Fatal("the lease's lock file is not locked")
	}
	if err := os.Remove(e.lockFile(id)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the removed lock file was not made again", func() bool { return locked(t, e.lockFile(id)) })
	e.open(time.Hour)
	if e.linked(d) {
		t.Fatal("another life recovered a live lease whose lock file had been removed and made again")
	}
}

// TestLeaseWithoutLock: a lease that cannot take its lock (its directory
// cannot be made) still holds intents, and no other life judges it, even
// one that finds the directory (made since) without its lock file.
func TestLeaseWithoutLock(t *testing.T) {
	e := newLeaseEnv(t, leaseRegistries[0].open)
	if err := os.WriteFile(e.dir, nil, 0o600); err != nil {
		t.Fatal(err) // a file where the directory should be
	}
	a := e.open(time.Hour)
	d := e.pend(a.Holder())
	if err := os.Remove(e.dir); err != nil {
		t.Fatal(err)
	}
	e.open(time.Hour)
	if e.linked(d) {
		t.Fatal("a lease without a lock was judged dead")
	}
	if err := a.Close(); err != nil || !e.linked(d) {
		t.Fatalf("Close of a lease without a lock: %v, linked %v", err, e.linked(d))
	}
}

// TestLeaseOtherHost: a holder of another host, or one this package did
// not name, is never judged by a lock, however free: it waits for its
// lapse.
func TestLeaseOtherHost(t *testing.T) {
	e := newLeaseEnv(t, leaseRegistries[0].open)
	id := newID()
	hs := []string{
		"test:w:" + e.host + "-other:1:" + id,
		"test:w:" + e.host + ":1:" + id[:16], // an earlier version's holder
		"test:w2:" + e.host + ":1:" + id,     // another writer
		"1:" + id,                            // nobody's
	}
	var ds []blob.Digest
	for _, h := range hs {
		ds = append(ds, e.pend(h))
	}
	e.open(time.Hour)
	for i, d := range ds {
		if e.linked(d) {
			t.Errorf("holder %s was recovered", hs[i])
		}
	}
	got, err := e.reg.Holders(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(got)
	slices.Sort(hs)
	if !slices.Equal(got, hs) {
		t.Fatalf("holders %v, want %v", got, hs)
	}
}

// TestLeaseConfig: a bad config is an error and starts nothing.
func TestLeaseConfig(t *testing.T) {
	reg := namespaces.NewMem(nil)
	dir := t.TempDir()
	for _, c := range []namespaces.LeaseConfig{
		{Name: "w", TTL: time.Second, LockDir: dir},
		{Registry: reg, TTL: time.Second, LockDir: dir},
		{Registry: reg, Name: "w", LockDir: dir},
		{Registry: reg, Name: "w", TTL: time.Second, LockDir: "relative"},
	} {
		if l, err := namespaces.OpenLease(t.Context(), c); err == nil {
			l.Close()
			t.Errorf("OpenLease(%+v) succeeded", c)
		}
	}
	if ents, _ := os.ReadDir(dir); len(ents) != 0 {
		t.Errorf("failed opens left %d files", len(ents))
	}
}
