package namespaces_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// TestCount: one is singular, every other count plural.
func TestCount(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{{0, "0 blobs"}, {1, "1 blob"}, {2, "2 blobs"}, {-1, "-1 blobs"}} {
		if got := namespaces.Count(tc.n, "blob"); got != tc.want {
			t.Errorf("Count(%d, blob) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

// TestQuotaMessageSingular: a refusal with one blob held says "1 blob".
func TestQuotaMessageSingular(t *testing.T) {
	ctx := t.Context()
	r := namespaces.NewMem(nil)
	if err := r.Create(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if err := r.SetQuota(ctx, "a", namespaces.Quota{Blobs: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.LinkSized(ctx, "a", blob.Sum([]byte("1")), 1); err != nil {
		t.Fatal(err)
	}
	_, err := r.LinkSized(ctx, "a", blob.Sum([]byte("2")), 1)
	if !errors.Is(err, blob.ErrQuota) || !strings.Contains(err.Error(), "1 blob + 1 over the limit of 1") {
		t.Errorf("a link over a quota of 1 blob: %v; want ErrQuota saying \"1 blob + 1 over the limit of 1\"", err)
	}
}
