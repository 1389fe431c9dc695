package store_test

import (
	"bytes"
	"io"
	"testing"

	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
	"github.com/alkblobfs/alkblobfs/engines/s3"
	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
	"github.com/alkblobfs/alkblobfs/store"
)

// TestFleetS3: an S3 large tier is fleet shared media without a
// --shared-media declaration, and a large blob one instance puts is read
// by another through its own engine.
func TestFleetS3(t *testing.T) {
	dsn, u := pgtest.DSN(t), s3test.URL(t)
	open := func() *store.Store {
		l, err := s3.OpenURL(t.Context(), u, nil)
		if err != nil {
			t.Fatal(err)
		}
		return openWith(t, store.Config{KV: pgKV(t, dsn), Large: l, Fleet: true})
	}
	a, b := open(), open()
	v := randBytes(threshold * 3)
	d, pin := putPinned(t, a, v)
	defer pin.Release()
	r, ok, err := b.Get(t.Context(), d)
	if err != nil || !ok {
		t.Fatalf("B's Get of A's blob: %v, %v", ok, err)
	}
	defer r.Close()
	if r.Tier() != store.TierLarge {
		t.Fatalf("the blob is in tier %v; want the large tier", r.Tier())
	}
	got, err := io.ReadAll(r)
	if err != nil || !bytes.Equal(got, v) {
		t.Fatalf("B read %d bytes of A's blob (%v); equal %v", len(got), err, bytes.Equal(got, v))
	}
}
