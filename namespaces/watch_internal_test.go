package namespaces

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
)

// TestFeedOverflow: a feed whose consumer does not read never makes its
// source wait; past feedMax changes it drops them for one Resync, and the
// changes after come in order behind it.
func TestFeedOverflow(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	f := newFeed(ctx)
	done := make(chan struct{})
	go func() {
		for i := range feedMax + 10 {
			f.push(Change{Kind: Unlinked, Namespace: "n", Digest: blob.Sum([]byte{byte(i)})})
		}
		f.push(Change{Kind: Created, Namespace: "after"})
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("push waited for a consumer")
	}
	// The forwarder may hold one change it took before the overflow.
	var got []Change
	for len(got) == 0 || got[len(got)-1].Namespace != "after" {
		select {
		case c := <-f.out:
			got = append(got, c)
		case <-time.After(10 * time.Second):
			t.Fatalf("after %d changes, no more", len(got))
		}
	}
	k := -1
	for i, c := range got {
		if c.Kind == Resync {
			k = i
		}
	}
	if k < 0 || k > 1 || !errors.Is(got[k].Err, errBehind) || len(got) > 20 {
		t.Fatalf("got %d changes, resync at %d: want at most one taken early, one resync saying why, then only what came after it", len(got), k)
	}
	// What follows the resync is what was pushed after the overflow, in
	// order.
	for i := k + 1; i+2 < len(got); i++ {
		if got[i].Digest == got[i+1].Digest {
			t.Fatalf("change %d repeated", i)
		}
	}
}

// TestParseNote: the payloads watchOpen's statements send, read back;
// the registry's own left out; an unreadable one is a resync.
func TestParseNote(t *testing.T) {
	r := &SQL{origin: "me"}
	d := blob.Sum([]byte("x"))
	for _, tc := range []struct {
		payload string
		want    Change
		ok      bool
	}{
		{"u other ns " + d.String(), Change{Kind: Unlinked, Namespace: "ns", Digest: d}, true},
		{"c other ns", Change{Kind: Created, Namespace: "ns"}, true},
		{"r other ns", Change{Kind: Removed, Namespace: "ns"}, true},
		{"p other ns", Change{Kind: PermChanged, Namespace: "ns"}, true},
		{"u me ns " + d.String(), Change{}, false},
		{"c me ns", Change{}, false},
		{"z other ns", Change{}, false},
		{"u other ns nothex", Change{Kind: Resync}, true},
		{"garbage", Change{Kind: Resync}, true},
	} {
		c, ok := r.parseNote(tc.payload)
		if ok != tc.ok || c.Kind != tc.want.Kind || c.Namespace != tc.want.Namespace || c.Digest != tc.want.Digest {
			t.Errorf("parseNote(%q) = %v, %v; want %v, %v", tc.payload, c, ok, tc.want, tc.ok)
		}
	}
}
