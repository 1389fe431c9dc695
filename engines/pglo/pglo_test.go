package pglo_test

import (
	"bytes"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/enginetest"
	"github.com/alkblobfs/alkblobfs/engines/pglo"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/postgres/pgtest"
)

func TestEngine(t *testing.T) {
	enginetest.Run(t, func(t *testing.T) engines.Engine { return open(t, pgtest.DSN(t)) })
}

func open(t *testing.T, dsn string) *pglo.Engine {
	t.Helper()
	e, err := pglo.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestChunkBoundaries writes blobs around the 512 KiB chunk in odd-sized
// writes and reads them back with reads that straddle windows.
func TestChunkBoundaries(t *testing.T) {
	e := open(t, pgtest.DSN(t))
	defer e.Close()
	for _, n := range []int{chunk - 1, chunk, chunk + 1, 2*chunk + 333, 5*chunk - 7} {
		v := randBytes(n)
		st, err := e.Stage(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		for off, step := 0, 1; off < n; off, step = off+step, step*3+1 {
			if _, err := st.Write(v[off:min(off+step, n)]); err != nil {
				t.Fatal(err)
			}
		}
		d := blob.Sum(v)
		if err := st.Commit(t.Context(), d); err != nil {
			t.Fatal(err)
		}
		c, err := e.Open(t.Context(), d)
		if err != nil {
			t.Fatal(err)
		}
		for _, size := range []int{1000, 100 << 10, chunk, chunk + 1, 3 * chunk} {
			got := make([]byte, 0, n)
			p := make([]byte, size)
			for off := 0; ; off += size {
				k, err := c.ReadAt(p, int64(off))
				got = append(got, p[:k]...)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("%d-byte blob, %d-byte reads: ReadAt(%d): %v", n, size, off, err)
				}
			}
			if !bytes.Equal(got, v) {
				t.Fatalf("%d-byte blob read back in %d-byte reads differs", n, size)
			}
		}
		c.Close()
	}
	if n := residue(t, e); n != 0 {
		t.Fatalf("StageResidue = %d", n)
	}
}

// TestObjects checks the large objects themselves: Delete unlinks, an
// object nobody owns counts as residue, a cursor outliving its blob errs
// with ErrMissing, and the sums column round-trips.
func TestObjects(t *testing.T) {
	e := open(t, pgtest.DSN(t))
	defer e.Close()
	ctx := t.Context()
	pool := e.Pool()
	objects := func() int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_largeobject_metadata`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	v := randBytes(chunk + 10)
	d := blob.Sum(v)
	st, _ := e.Stage(ctx)
	st.Write(v)
	st.(engines.SidecarStage).SetSidecar([]byte("sums"))
	if err := st.Commit(ctx, d); err != nil {
		t.Fatal(err)
	}
	if b, err := e.Sidecar(ctx, d); err != nil || string(b) != "sums" {
		t.Fatalf("Sidecar = %q, %v", b, err)
	}
	plain := commit(t, e, randBytes(10))
	if _, err := e.Sidecar(ctx, plain); !errors.Is(err, blob.ErrMissing) {
		t.Fatalf("Sidecar of a blob without one: %v; want ErrMissing", err)
	}
	if n := objects(); n != 2 {
		t.Fatalf("%d large objects for 2 blobs", n)
	}

	c, err := e.Open(ctx, d)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := e.Delete(ctx, d); err != nil {
		t.Fatal(err)
	}
	if n := objects(); n != 1 {
		t.Fatalf("%d large objects after Delete; want 1", n)
	}
	if _, err := c.ReadAt(make([]byte, 10), 0); !errors.Is(err, blob.ErrMissing) {
		t.Fatalf("ReadAt after Delete: %v; want ErrMissing", err)
	}

	if _, err := pool.Exec(ctx, `SELECT lo_create(0)`); err != nil {
		t.Fatal(err)
	}
	if n := residue(t, e); n != 1 {
		t.Fatalf("StageResidue with one unowned object = %d; want 1", n)
	}
}

// TestCloseWithOpenStage: Close rolls back a stage left open instead of
// waiting for it, and the stage is over.
func TestCloseWithOpenStage(t *testing.T) {
	dsn := pgtest.DSN(t)
	e := open(t, dsn)
	st, err := e.Stage(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write(randBytes(2 * chunk)); err != nil { // transaction open
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- e.Close() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute):
		t.Fatal("Close waited for an open stage")
	}
	if err := st.Commit(t.Context(), blob.Sum(nil)); err == nil {
		t.Fatal("Commit after Close succeeded")
	}
	e = open(t, dsn)
	defer e.Close()
	if n := residue(t, e); n != 0 {
		t.Fatalf("StageResidue after Close = %d", n)
	}
}

// TestOpenPool shares a pool: the engine works on it and leaves it open.
func TestOpenPool(t *testing.T) {
	dsn := pgtest.DSN(t)
	kv, err := postgres.Open(t.Context(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer kv.Close()
	e, err := pglo.OpenPool(t.Context(), kv.Pool())
	if err != nil {
		t.Fatal(err)
	}
	v := randBytes(1000)
	readAll(t, e, commit(t, e, v), v)
	if !strings.HasPrefix(e.Name(), "pglo:postgres://") || !strings.Contains(e.Name(), "@127.0.0.1") {
		t.Errorf("Name = %q", e.Name())
	}
	e.Close()
	if err := kv.Pool().Ping(t.Context()); err != nil {
		t.Fatalf("the borrowed pool after Close: %v", err)
	}
}

// TestOpenUnreachable: one line naming host:port, never the password.
func TestOpenUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, err = pglo.Open(t.Context(), "postgres://bob:pa55word-x@"+addr+"/db?sslmode=disable")
	if err == nil || !strings.Contains(err.Error(), addr) || strings.Contains(err.Error(), "pa55word-x") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Open of a closed port: %v; want one line naming %s without the password", err, addr)
	}
}

// TestReopen: blobs are durable across a close (the delete window:
// meta's TestPgloReopen).
func TestReopen(t *testing.T) {
	dsn := pgtest.DSN(t)
	enginetest.Reopen(t, func(t *testing.T) engines.Engine { return open(t, dsn) })
}
