package s3_test

import (
	"encoding/binary"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/s3/s3test"
)

// BenchmarkList100k measures listing 100 000 blobs through List:
//
//	scripts/s3.sh go test -run '^$' -bench List100k -benchtime 3x ./engines/s3/
//
// It puts the blobs first (minutes), under a fresh prefix it logs; with
// ALKBLOBFS_S3_LIST_PREFIX set to that prefix (and the same server) it
// lists what is there instead.
func BenchmarkList100k(b *testing.B) {
	const n = 100_000
	u := s3test.URL(b)
	prefix := os.Getenv("ALKBLOBFS_S3_LIST_PREFIX")
	if prefix != "" {
		u = s3test.WithPrefix(b, os.Getenv(s3test.EnvURL), prefix)
	}
	e, err := s3OpenURL(b, u)
	if err != nil {
		b.Fatal(err)
	}
	defer e.Close()
	if prefix == "" {
		start := time.Now()
		var next atomic.Int64
		var wg sync.WaitGroup
		for range 32 {
			wg.Go(func() {
				for {
					i := next.Add(1) - 1
					if i >= n {
						return
					}
					var v [8]byte
					binary.LittleEndian.PutUint64(v[:], uint64(i))
					if err := tryCommit(e, v[:]); err != nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		if b.Failed() {
			return
		}
		el := time.Since(start)
		b.Logf("put %d blobs in %v (%.0f/s) under prefix %s", n, el.Round(time.Millisecond), n/el.Seconds(), e.Config().Prefix)
	}
	b.ResetTimer()
	for b.Loop() {
		start := time.Now()
		got := 0
		var last blob.Digest
		for en, err := range e.List(b.Context(), blob.Digest{}) {
			if err != nil {
				b.Fatal(err)
			}
			if got > 0 && en.Digest.Compare(last) <= 0 {
				b.Fatal("out of order")
			}
			last = en.Digest
			got++
		}
		el := time.Since(start)
		b.Logf("listed %d blobs in %v (%.0f/s)", got, el.Round(time.Millisecond), float64(got)/el.Seconds())
		if got != n {
			b.Fatalf("listed %d; want %d", got, n)
		}
	}
}
