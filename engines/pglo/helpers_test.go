package pglo_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"io"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/pglo"
)

const chunk = 512 << 10 // the engine's write chunk and read window

func randBytes(n int) []byte {
	b := make([]byte, n)
	rand.Read(b)
	return b
}

func tryCommit(e *pglo.Engine, v []byte) error {
	st, err := e.Stage(context.Background())
	if err != nil {
		return err
	}
	defer st.Discard()
	if _, err := st.Write(v); err != nil {
		return err
	}
	return st.Commit(context.Background(), blob.Sum(v))
}

func commit(t *testing.T, e *pglo.Engine, v []byte) blob.Digest {
	t.Helper()
	if err := tryCommit(e, v); err != nil {
		t.Fatal(err)
	}
	return blob.Sum(v)
}

func readAll(t *testing.T, e engines.Engine, d blob.Digest, want []byte) {
	t.Helper()
	c, err := e.Open(t.Context(), d)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := io.ReadAll(io.NewSectionReader(c, 0, c.Len()))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("read back %d bytes, want %d (or other bytes)", len(got), len(want))
	}
}

func residue(t *testing.T, e *pglo.Engine) int {
	t.Helper()
	n, err := e.StageResidue(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return n
}
