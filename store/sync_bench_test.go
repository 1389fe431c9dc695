package store_test

import (
	"encoding/binary"
	"path/filepath"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/store"
)

// BenchmarkSmallPutSync is the cost of the sync timer on the small-file
// write path: 1 KiB puts into sqlite+local, one after another, with the
// timer off, at its default of 1s and at 100ms; and, for comparison, a
// Sync after every put (what an fsync(2) after each close costs).
//
//	go test -run '^$' -bench SmallPutSync -benchtime 3s -count 5 ./store
func BenchmarkSmallPutSync(b *testing.B) {
	for _, c := range []struct {
		name    string
		every   time.Duration
		syncPut bool
	}{
		{"timer=off", -1, false},
		{"timer=1s", 0, false},
		{"timer=100ms", 100 * time.Millisecond, false},
		{"sync-each-put", -1, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			dir := b.TempDir()
			cfg := store.Config{KV: sqliteKV(b, dir), Large: localLarge(b, dir), SyncEvery: c.every, ScratchDir: filepath.Join(dir, "scratch")}
			s, err := store.Open(b.Context(), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer s.Close()
			v := make([]byte, 1<<10)
			i := uint64(0)
			for b.Loop() {
				i++
				binary.LittleEndian.PutUint64(v, i)
				_, pin, err := s.PutBytes(b.Context(), v)
				if err != nil {
					b.Fatal(err)
				}
				pin.Release()
				if c.syncPut {
					if err := s.Sync(b.Context()); err != nil {
						b.Fatal(err)
					}
				}
			}
		})
	}
}
