package main

import (
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
)

func TestNamespaceLifecycle(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	if got := c.OK("ns", "ls"); got != "" {
		t.Fatalf("ns ls on a new store = %q", got)
	}
	c.OK("ns", "create", "b", "a")
	c.Fail(1, `create "a": namespace exists`, "ns", "create", "a")
	if got := clitest.Lines(c.OK("ns", "ls")); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("ns ls = %q", got)
	}

	p, _, d := clitest.WriteFile(t, t.TempDir(), clitest.SmallSize, 20)
	c.OK("put", "--ns", "a", p)
	if got := clitest.Lines(c.OK("ns", "ls", "-l")); !slices.Equal(got, []string{"a 1 1000", "b 0 0"}) {
		t.Fatalf("ns ls -l = %q", got)
	}
	c.Fail(1, "namespace not empty", "ns", "rm", "a")
	c.Fail(1, "unlink its blobs first", "ns", "rm", "a")
	if got := clitest.Lines(c.OK("ls", "a")); !slices.Equal(got, []string{d}) {
		t.Fatalf("a failed ns rm changed the namespace: ls a = %q", got)
	}
	c.OK("unlink", "a", d)
	c.OK("ns", "rm", "a")
	c.Fail(1, noNamespaceToRemove("a").Error(), "ns", "rm", "a")
	c.Fail(1, noNamespace("a").Error(), "ls", "a")
	if got := clitest.Lines(c.OK("ns", "ls")); !slices.Equal(got, []string{"b"}) {
		t.Fatalf("ns ls after rm = %q", got)
	}
	// Bare "ns" and "ns typo" are usage errors; bare "ns" prints the
	// usage first.
	if r := c.Run(nil, "ns"); r.Code != 2 || !strings.Contains(r.Stderr, "Available Commands") || !strings.HasSuffix(r.Stderr, "alkblobfs: no subcommand given (see 'alkblobfs ns --help')\n") {
		t.Errorf("bare ns: exit %d, stderr %q", r.Code, r.Stderr)
	}
	c.Fail(2, `unknown command "craete"`, "ns", "craete")
}

func TestPutNsLsUnlinkLink(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	dir := t.TempDir()
	smallPath, _, smallD := clitest.WriteFile(t, dir, clitest.SmallSize, 21)
	largePath, _, largeD := clitest.WriteFile(t, dir, clitest.LargeSize, 22)
	otherPath, _, otherD := clitest.WriteFile(t, dir, clitest.SmallSize, 23)
	c.OK("ns", "create", "builds")

	// The namespace is checked before any file is read: an absent one
	// wins over a missing file, and nothing is stored.
	c.Fail(1, noNamespace("nope").Error(), "put", "--ns", "nope", filepath.Join(dir, "no-such-file"))
	c.Fail(1, "ns create nope", "put", "--ns", "nope", smallPath)
	if got := c.OK("ls"); got != "" {
		t.Fatalf("put into an absent namespace stored something: ls = %q", got)
	}

	if got := clitest.Lines(c.OK("put", "--ns", "builds", smallPath, largePath)); !slices.Equal(got, []string{smallD, largeD}) {
		t.Fatalf("put --ns printed %q", got)
	}
	c.OK("put", otherPath) // stored, not linked
	want := slices.Sorted(slices.Values([]string{smallD, largeD}))
	if got := clitest.Lines(c.OK("ls", "builds")); !slices.Equal(got, want) {
		t.Fatalf("ls builds = %q, want %q", got, want)
	}
	if got := len(clitest.Lines(c.OK("ls"))); got != 3 {
		t.Fatalf("ls lists %d blobs, want 3", got)
	}
	long := c.OK("ls", "-l", "builds")
	if !strings.Contains(long, largeD+" 307200 ") || !strings.Contains(long, smallD+" 1000 ") {
		t.Errorf("ls -l builds = %q", long)
	}

	// unlink checks every reference first: one that is not there changes
	// nothing.
	c.Fail(1, "not linked in this namespace", "unlink", "builds", smallD, otherD)
	if got := clitest.Lines(c.OK("ls", "builds")); !slices.Equal(got, want) {
		t.Fatalf("a failed unlink changed the namespace: %q", got)
	}
	c.OK("unlink", "builds", smallD)
	if got := clitest.Lines(c.OK("ls", "builds")); !slices.Equal(got, []string{largeD}) {
		t.Fatalf("ls builds after unlink = %q", got)
	}
	c.Fail(1, "not linked", "unlink", "builds", smallD)
	c.Fail(1, noNamespace("nope").Error(), "unlink", "nope", smallD)

	// link is pool-checked and all or nothing.
	absent := strings.Repeat("ab", 32)
	c.Fail(1, absent+": blob missing", "link", "builds", otherD, absent)
	if got := clitest.Lines(c.OK("ls", "builds")); !slices.Equal(got, []string{largeD}) {
		t.Fatalf("a refused link changed the namespace: %q", got)
	}
	c.OK("link", "builds", otherD, smallD, otherD)
	want = slices.Sorted(slices.Values([]string{smallD, largeD, otherD}))
	if got := clitest.Lines(c.OK("ls", "builds")); !slices.Equal(got, want) {
		t.Fatalf("ls builds after link = %q, want %q", got, want)
	}
	c.Fail(1, noNamespace("nope").Error(), "link", "nope", otherD)
}

// TestSweepCollectsUnlinked is the GC composition through the CLI: on the
// SQLite durable window, the first sweep stages what no namespace links and
// the second deletes it; linked blobs, in either tier, survive intact.
func TestSweepCollectsUnlinked(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	dir := t.TempDir()
	c.OK("ns", "create", "keep")
	type blob struct {
		path, digest string
		content      []byte
	}
	var kept, dropped []blob
	for i, size := range []int{clitest.SmallSize, clitest.LargeSize, clitest.SmallSize, clitest.LargeSize} {
		p, content, d := clitest.WriteFile(t, dir, size, uint64(30+i))
		c.OK("put", p)
		b := blob{p, d, content}
		if i < 2 {
			c.OK("link", "keep", d)
			kept = append(kept, b)
		} else {
			dropped = append(dropped, b)
		}
	}

	rep := c.SweepJSON()
	if rep["candidates_queued"] != float64(2) || rep["deleted"] != float64(0) || rep["live"] != float64(2) {
		t.Fatalf("first sweep = %v, want 2 staged, 0 deleted, 2 live", rep)
	}
	if got := len(clitest.Lines(c.OK("ls"))); got != 4 {
		t.Fatalf("the staging sweep deleted something: %d blobs left", got)
	}
	rep = c.SweepJSON()
	if rep["deleted"] != float64(2) || rep["bytes_freed"] != float64(clitest.SmallSize+clitest.LargeSize) || rep["window_pending"] != float64(0) {
		t.Fatalf("second sweep = %v, want 2 deleted", rep)
	}
	for _, b := range dropped {
		c.Fail(1, "blob missing", "stat", b.digest)
	}
	want := slices.Sorted(slices.Values([]string{kept[0].digest, kept[1].digest}))
	if got := clitest.Lines(c.OK("ls")); !slices.Equal(got, want) {
		t.Fatalf("ls after two sweeps = %q, want %q", got, want)
	}
	for _, b := range kept {
		got := c.OK("cat", b.digest)
		if s := sha256.Sum256([]byte(got)); hex.EncodeToString(s[:]) != b.digest || got != string(b.content) {
			t.Fatalf("cat %s after sweeps: wrong content", b.digest)
		}
	}
	// Unlinking makes a blob collectable in turn.
	c.OK("unlink", "keep", kept[0].digest)
	c.SweepJSON()
	if rep := c.SweepJSON(); rep["deleted"] != float64(1) {
		t.Fatalf("sweeps after unlink = %v, want 1 deleted", rep)
	}
	if got := clitest.Lines(c.OK("ls")); !slices.Equal(got, []string{kept[1].digest}) {
		t.Fatalf("ls = %q, want [%s]", got, kept[1].digest)
	}
}

func TestRmLinkedRefused(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	p, content, d := clitest.WriteFile(t, t.TempDir(), clitest.LargeSize, 40)
	c.OK("ns", "create", "a", "b")
	c.OK("put", "--ns", "b", p)
	r := c.Fail(1, "refused", "rm", d)
	if !strings.Contains(r.Stderr, "linked in namespace b") || !strings.Contains(r.Stderr, "alkblobfs unlink b "+d) {
		t.Errorf("refusal does not say who links the blob: %q", r.Stderr)
	}
	if got := c.OK("cat", d); got != string(content) {
		t.Fatal("a refused rm changed the blob")
	}
	c.OK("unlink", "b", d)
	c.OK("rm", d)
	c.Fail(1, "blob missing", "stat", d)
}

type verifyJSON struct {
	Bad []struct {
		Digest, Tier, Status, Error string
	} `json:"bad"`
	Checked, Corrupt, Unreadable, Missing int
}

func TestVerify(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	dir := t.TempDir()
	_, _, smallD := clitest.WriteFile(t, dir, clitest.SmallSize, 50)
	_, _, largeD := clitest.WriteFile(t, dir, clitest.LargeSize, 51)
	_, _, otherD := clitest.WriteFile(t, dir, clitest.LargeSize, 52)
	c.OK("put", filepath.Join(dir, "blob-1000-50"), filepath.Join(dir, "blob-307200-51"), filepath.Join(dir, "blob-307200-52"))

	if out := c.OK("verify"); !strings.HasPrefix(out, "verified 3 blobs (") || !strings.Contains(out, "all intact") {
		t.Fatalf("verify on a clean store printed %q", out)
	}
	var v verifyJSON
	if err := json.Unmarshal([]byte(c.OK("verify", "--json", "-j", "1")), &v); err != nil || v.Checked != 3 || len(v.Bad) != 0 {
		t.Fatalf("verify --json = %+v (%v)", v, err)
	}

	// Flip one byte in a large blob's file.
	blobPath := filepath.Join(c.Data, "large", "blobs", largeD[:2], largeD)
	if err := os.Chmod(blobPath, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(blobPath)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/3] ^= 0x80
	if err := os.WriteFile(blobPath, b, 0o644); err != nil {
		t.Fatal(err)
	}
	// And one byte of a kv blob's row.
	corruptKV(t, filepath.Join(c.Data, "kv.db"), smallD)

	r := c.Run(nil, "verify")
	clitest.CheckFail(t, r, 1, "2 of 3 blobs bad (2 corrupt", []string{"verify"})
	out := clitest.Lines(r.Stdout) // two CORRUPT lines in either order, then the summary
	if len(out) != 3 {
		t.Fatalf("verify printed %q, want 3 lines", out)
	}
	for _, want := range []string{"CORRUPT " + largeD + " large: ", "CORRUPT " + smallD + " kv: "} {
		if !slices.ContainsFunc(out[:2], func(l string) bool { return strings.HasPrefix(l, want) }) {
			t.Errorf("verify printed %q, want a line %q…", out, want)
		}
	}
	if !strings.Contains(r.Stdout, "does not match") || !strings.Contains(r.Stdout, "verified 3 blobs") {
		t.Errorf("verify printed %q", r.Stdout)
	}

	// Named digests: only those are read.
	c.OK("verify", otherD)
	absent := strings.Repeat("cd", 32)
	r = c.Run(nil, "verify", "--json", otherD, largeD, absent)
	clitest.CheckFail(t, r, 1, "2 of 3 blobs bad (1 corrupt, 0 unreadable, 1 missing)", []string{"verify"})
	v = verifyJSON{}
	if err := json.Unmarshal([]byte(r.Stdout), &v); err != nil {
		t.Fatalf("verify --json printed %q: %v", r.Stdout, err)
	}
	if v.Checked != 2 || v.Corrupt != 1 || v.Missing != 1 || len(v.Bad) != 2 {
		t.Fatalf("verify --json = %+v", v)
	}
	for _, bad := range v.Bad {
		switch bad.Digest {
		case largeD:
			if bad.Status != "corrupt" || bad.Tier != "large" || !strings.Contains(bad.Error, "does not match") {
				t.Errorf("bad entry %+v", bad)
			}
		case absent:
			if bad.Status != "missing" {
				t.Errorf("bad entry %+v", bad)
			}
		default:
			t.Errorf("unexpected bad entry %+v", bad)
		}
	}
	c.Fail(2, "invalid digest", "verify", "xyz")
	c.Fail(2, "--jobs 0", "verify", "-j", "0")
}

// corruptKV flips a bit of d's value in the SQLite kv engine's table, as
// disk rot would.
func corruptKV(t *testing.T, path, digest string) {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	d, err := blob.Parse(digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := sqlite.FlipValueBit(t.Context(), db, d); err != nil {
		t.Fatal(err)
	}
}

// Bad namespace names are usage errors that state the rule, and are
// caught before the store is even opened: nothing changes.
func TestBadNamespaceNames(t *testing.T) {
	t.Parallel()
	c := clitest.NewCLI(t)
	p, _, d := clitest.WriteFile(t, t.TempDir(), clitest.SmallSize, 60)
	for _, name := range []string{"", ".hidden", "..", "a/b", "sp ace", "ü", strings.Repeat("x", 256)} {
		for _, args := range [][]string{
			{"ns", "create", name},
			{"ns", "create", "ok", name},
			{"ns", "rm", name},
			{"put", "--ns", name, p},
			{"ls", name},
			{"link", name, d},
			{"unlink", name, d},
		} {
			c.Fail(2, "1-255 bytes of A-Z a-z 0-9 . _ -", args...)
		}
	}
	if entries, err := os.ReadDir(c.Data); err != nil || len(entries) != 0 {
		t.Fatalf("bad names touched the data directory: %v %v", entries, err)
	}
	// On a populated store too.
	c.OK("ns", "create", "ok")
	c.OK("put", "--ns", "ok", p)
	c.Fail(2, "bad namespace name", "ns", "create", "fine", "no/slash")
	c.Fail(2, "bad namespace name", "put", "--ns", ".x", p)
	if got := clitest.Lines(c.OK("ns", "ls", "-l")); !slices.Equal(got, []string{"ok 1 1000"}) {
		t.Fatalf("ns ls -l after bad names = %q", got)
	}
}
