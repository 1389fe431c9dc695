package local

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// Sidecars live in sums/ab/<digest>, apart from blobs/ so that listing and
// passthrough never see them. A sidecar is a pure function of its blob's
// content, so a stale one left by a crash between deleting a blob and its
// sidecar is still right if the same content is ever put again, and a
// replace on dedup is harmless.

var _ engines.SidecarReader = (*Engine)(nil)

// SetSidecar implements engines.SidecarStage.
func (s *stage) SetSidecar(b []byte) {
	s.mu.Lock()
	s.sidecar = append([]byte(nil), b...)
	s.mu.Unlock()
}

func (e *Engine) sidecarPath(d blob.Digest) string {
	h := d.String()
	return filepath.Join(e.sumsDir, h[:2], h)
}

// writeSidecar writes b durably (a torn sidecar would fail good reads) by
// temp file, fsync and rename. The temp file is locked until it is renamed
// (createLocked): another process opening the store removes every
// unlocked file of the stage directory, and took an unlocked one for a
// crashed writer's, failing the commit it belonged to.
func (e *Engine) writeSidecar(d blob.Digest, b []byte) error {
	dir := filepath.Dir(e.sidecarPath(d))
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	f, err := e.createLocked("sums-*")
	if err != nil {
		return err
	}
	if _, err = f.Write(b); err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = os.Rename(f.Name(), e.sidecarPath(d))
	}
	if err != nil {
		os.Remove(f.Name())
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Sidecar implements engines.SidecarReader.
func (e *Engine) Sidecar(ctx context.Context, d blob.Digest) ([]byte, error) {
	b, err := os.ReadFile(e.sidecarPath(d))
	if err != nil {
		return nil, e.wrap("sidecar", d, err)
	}
	return b, nil
}

func (e *Engine) removeSidecar(d blob.Digest) {
	if err := os.Remove(e.sidecarPath(d)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		e.log.Warn("could not remove sidecar", "digest", d, "err", err)
	}
}
