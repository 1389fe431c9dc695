package store

import (
	"fmt"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// TestVerdicts (moved from fusefs with the verdicts): a corrupt mark
// survives any number of good verdicts (they are bounded apart, and never
// evict it); a good verdict about another version of the file is
// forgotten; the change of a suspect blob is reported once; marks that
// cannot be written to a shared ledger stay in the process.
func TestVerdicts(t *testing.T) {
	ctx := t.Context()
	var v goodVerdicts
	var l ledger // no shared ledger: marks stay in the process
	id := engines.FileID{Dev: 1, Ino: 2, Size: 3}
	other := engines.FileID{Dev: 1, Ino: 2, Size: 3, Ctime: unix.Timespec{Sec: 9}}
	bad := blob.Sum([]byte("bad"))
	if err := l.mark(ctx, bad, fileIdent(id, true), "test"); err != nil {
		t.Fatal(err)
	}
	for i := range 3 * goodMax {
		v.record(blob.Sum([]byte(fmt.Sprint(i))), id)
	}
	if m, ok, _ := l.get(ctx, bad); !ok || string(m.File) != string(fileIdent(id, true)) {
		t.Fatalf("after %d good verdicts the corrupt mark is %+v, %v", 3*goodMax, m, ok)
	}
	if len(v.good) > goodMax {
		t.Fatalf("%d good verdicts kept; the bound is %d", len(v.good), goodMax)
	}
	if v.suspectSeen(bad) || !v.suspectSeen(bad) {
		t.Fatal("a suspect blob's change is reported once, at its first sight")
	}
	v.record(bad, other)
	if good, changed := v.check(bad, other); !good || changed {
		t.Fatalf("after a good verification: good %v, changed %v", good, changed)
	}
	if good, changed := v.check(bad, id); good || !changed {
		t.Fatalf("good verdict about another version: good %v, changed %v", good, changed)
	}
	if good, changed := v.check(bad, id); good || changed {
		t.Fatalf("a forgotten verdict is unknown: good %v, changed %v", good, changed)
	}
	if err := l.clear(ctx, bad, fileIdent(other, true)); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := l.get(ctx, bad); !ok {
		t.Fatal("a clear for another version of the file removed the mark")
	}
	if err := l.clear(ctx, bad, fileIdent(id, true)); err != nil {
		t.Fatal(err)
	}
	if _, ok, _ := l.get(ctx, bad); ok {
		t.Fatal("the mark survived its clear")
	}
	if string(fileIdent(id, true)) == string(fileIdent(other, true)) || len(fileIdent(id, false)) != 0 {
		t.Fatal("file identities: a ctime change must change the identity; no file is empty")
	}
}
