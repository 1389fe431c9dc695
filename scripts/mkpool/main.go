// Command mkpool fills the default store under a data directory with many
// tiny distinct blobs, fast, and links a fraction of them into a namespace:
// the fixture of scripts/measure.sh sweep.
//
//	go run ./scripts/mkpool -data DIR -n 1000000 -link 0.1 -ns keep
//
// Blob i holds the 16 bytes "mkpool" + i, so its digest is sha256 of that.
// Puts one by one would each be a transaction; instead the rows go in
// through the SQLite kv engine's PutMany, the statements of its Put for
// the database's layout, in transactions of -batch rows, in digest order
// (near-appends to the key B-tree). That bypasses only the store
// facade (no pins: nothing else runs). The links go through the namespaces
// registry's LinkMany. Opening the engine creates the schema first.
//
// -pins N also writes N gc_pins rows under a foreign owner
// (pinOwner, as if another mount held them), expiring in ten years, in
// transactions of -batch rows: the fixture of scripts/measure.sh.
// Their digests, sha256 of "mkpin" + j, are of no blob in the pool, so a
// sweep deletes exactly what it deletes without them and only pays for
// the bigger table (the reap scan, the arbitration lookups).
package main

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"flag"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

func main() {
	data := flag.String("data", "", "data directory of the store (required)")
	n := flag.Int("n", 1_000_000, "number of blobs")
	frac := flag.Float64("link", 0.1, "fraction of the blobs linked into -ns")
	ns := flag.String("ns", "keep", "namespace the linked blobs go into")
	batch := flag.Int("batch", 100_000, "rows per transaction")
	pins := flag.Int("pins", 0, "number of foreign gc_pins rows to write (digests of no blob in the pool)")
	flag.Parse()
	if *data == "" || *n < 1 || *frac < 0 || *frac > 1 || *batch < 1 || *pins < 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(context.Background(), *data, *n, *frac, *ns, *batch, *pins); err != nil {
		log.Fatal(err)
	}
}

type entry struct {
	d blob.Digest
	i uint64
}

func content(i uint64) []byte { return key("mkpool", i) }

// key is 16 bytes: prefix, zero-padded to 8, then i big-endian.
func key(prefix string, i uint64) []byte {
	b := make([]byte, 16)
	copy(b, prefix)
	binary.BigEndian.PutUint64(b[8:], i)
	return b
}

// pinOwner owns the -pins rows: the shape of a real owner (host:pid:suffix)
// on a host that is not this one.
const pinOwner = "other-host:1:measure"

func run(ctx context.Context, data string, n int, frac float64, ns string, batch, pins int) error {
	start := time.Now()
	if err := os.MkdirAll(data, 0o700); err != nil {
		return err
	}
	e, err := sqlite.Open(ctx, filepath.Join(data, "kv.db"))
	if err != nil {
		return err
	}
	defer e.Close()

	es := make([]entry, n)
	for i := range es {
		es[i] = entry{sha256.Sum256(content(uint64(i))), uint64(i)}
	}
	slices.SortFunc(es, func(a, b entry) int { return a.d.Compare(b.d) })

	for chunk := range slices.Chunk(es, batch) {
		ds, values := make([]blob.Digest, len(chunk)), make([][]byte, len(chunk))
		for k, x := range chunk {
			ds[k], values[k] = x.d, content(x.i)
		}
		if _, err := e.PutMany(ctx, ds, values); err != nil {
			return err
		}
	}
	inserted := time.Since(start)

	reg, err := namespaces.OpenSQL(ctx, e, nil)
	if err != nil {
		return err
	}
	if err := reg.Create(ctx, ns); err != nil {
		return err
	}
	// Every step-th blob in digest order: spread over the whole key range.
	var linked []blob.Digest
	if m := int(float64(n) * frac); m > 0 {
		step := float64(n) / float64(m)
		for j := range m {
			linked = append(linked, es[int(float64(j)*step)].d)
		}
	}
	for chunk := range slices.Chunk(linked, batch) {
		if _, err := reg.LinkMany(ctx, ns, chunk); err != nil {
			return err
		}
	}
	if pins > 0 {
		if err := writePins(ctx, e, pins, batch); err != nil {
			return err
		}
	}
	fmt.Printf("mkpool: %d blobs in %s, %d linked into %q, %d foreign pin rows, total %s\n",
		n, inserted.Round(time.Millisecond), len(linked), ns, pins, time.Since(start).Round(time.Millisecond))
	return nil
}

// writePins writes n gc_pins rows owned by pinOwner for the digests of
// "mkpin" + j, in digest order, batch rows per transaction, through the
// engine's shared state (meta.Host.PinRows).
func writePins(ctx context.Context, e *sqlite.Engine, n, batch int) error {
	ds := make([]blob.Digest, n)
	for j := range ds {
		ds[j] = sha256.Sum256(key("mkpin", uint64(j)))
	}
	slices.SortFunc(ds, blob.Digest.Compare)
	const ttl = 10 * 365 * 24 * time.Hour
	for chunk := range slices.Chunk(ds, batch) {
		if err := e.Meta().Host.PinRows(ctx, pinOwner, chunk, ttl); err != nil {
			return err
		}
	}
	return nil
}
