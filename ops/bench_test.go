package ops_test

import (
	"bytes"
	"encoding/binary"
	"sync/atomic"
	"testing"
)

// BenchmarkPutSmall: 1 KiB puts over a real listener, 8 at a time.
func BenchmarkPutSmall(b *testing.B) {
	e := newEnv(b, envOptions{})
	var n atomic.Uint64
	b.SetParallelism(4) // × GOMAXPROCS (2 here): 8 clients
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		body := make([]byte, 1024)
		for pb.Next() {
			binary.LittleEndian.PutUint64(body, n.Add(1))
			if _, _, err := e.c.Put(b.Context(), "builds", bytes.NewReader(body), int64(len(body)), nil); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
