//go:build linux

package fusefs

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	poolmeta "github.com/alkblobfs/alkblobfs/meta"
)

// The settle at a file's last RELEASE is a lazy job of SQLite's Batcher:
// it lingers (meta.Linger) for the next close to share its
// transaction. Nothing a program waits for may wait that linger out: not
// the stat, chmod, utimes and rename rsync sends right after each close
// (those need no settle), nor a lookup or listing of the namespace (those
// need it, and hurry it). The tests make the linger far longer than any
// of those requests may take, so that one waiting behind it shows at once
// whatever the machine's load.
const (
	longLinger = 8 * time.Second
	// behindLinger: a request slower than this waited for the linger.
	behindLinger = 3 * time.Second
)

// mountLongLinger mounts the default store (SQLite, the one engine with a
// Batcher) with a linger of longLinger.
func mountLongLinger(t *testing.T) *env {
	e := mountStore(t, defaultSpec)
	b, ok := e.kv.(poolmeta.Batching)
	if !ok || b.Batcher() == nil {
		t.Fatalf("%T has no Batcher", e.kv)
	}
	b.Batcher().SetLinger(longLinger)
	return e
}

// timed fails t if fn fails or takes behindLinger or longer.
func timed(t *testing.T, what string, fn func() error) {
	t.Helper()
	start := time.Now()
	err := fn()
	if d := time.Since(start); d >= behindLinger {
		t.Errorf("%s took %v: it waited for the settle's %v linger", what, d.Round(time.Millisecond), longLinger)
	}
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// awaitSettling waits until the RELEASE of every closed file has taken its
// intent to settle it: its settle is queued, lingering.
func awaitSettling(t *testing.T, e *env) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); e.srv.fs.intents.open.Load() != 0; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%d intents still unsettled 10 s after the close: no RELEASE came", e.srv.fs.intents.open.Load())
		}
	}
}

// TestCloseNotBehindLinger: what rsync does to its temporary file right
// after closing it (lstat, chmod, utimes, lstat, rename) answers at once
// while the file's settle lingers, and so does a stat of ns/<digest>,
// which needs that settle and hurries it: it finds the file.
func TestCloseNotBehindLinger(t *testing.T) {
	e := mountLongLinger(t)
	e.mkns("l")
	content := randBytes(41, 4096)
	tmp, final := e.path("l", "incoming", ".f.XXXXXX"), e.path("l", "incoming", "f")
	writeFile(t, tmp, content)
	awaitSettling(t, e)

	timed(t, "lstat of the closed file", func() error { _, err := os.Lstat(tmp); return err })
	timed(t, "chmod", func() error { return os.Chmod(tmp, 0o640) })
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	timed(t, "utimes", func() error { return os.Chtimes(tmp, mtime, mtime) })
	timed(t, "rename", func() error { return os.Rename(tmp, final) })
	timed(t, "lstat after the rename", func() error {
		fi, err := os.Lstat(final)
		if err == nil && (fi.Mode().Perm() != 0o640 || !fi.ModTime().Equal(mtime) || fi.Size() != 4096) {
			err = fmt.Errorf("mode %v, mtime %v, size %d; want 0640, %v, 4096", fi.Mode(), fi.ModTime(), fi.Size(), mtime)
		}
		return err
	})
	timed(t, "stat of ns/<digest>", func() error { _, err := os.Stat(e.path("l", sum(content))); return err })
}

// TestRsyncNotBehindLinger: rsync -a of a few files into incoming/ takes
// no linger per file, and a listing of the namespace right after it (which
// waits for the last file's settle) lists them all at once.
func TestRsyncNotBehindLinger(t *testing.T) {
	e := mountLongLinger(t)
	e.mkns("r")
	src := t.TempDir()
	var want []string
	for i := range 3 {
		b := randBytes(uint64(50+i), 4096)
		writeFile(t, filepath.Join(src, fmt.Sprintf("f%d", i)), b)
		want = append(want, sum(b))
	}
	slices.Sort(want)
	timed(t, "rsync -a of 3 files", func() error {
		run(t, "", "rsync", "-a", src+"/", e.path("r", "incoming")+"/")
		return nil
	})
	timed(t, "listing the namespace", func() error {
		if got := e.listNS(t, "r"); !slices.Equal(got, want) {
			return fmt.Errorf("lists %v, want %v", short(got), short(want))
		}
		return nil
	})
}
