package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"sync"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// Engine stores blobs as files under a directory.
type Engine struct {
	dir      string
	blobDir  string
	stageDir string
	sumsDir  string
	log      *slog.Logger
	ro       bool // opened on read-only media
	// writeback starts writing out [off, off+n) of a stage file
	// (startWriteback; tests record the calls).
	writeback func(f *os.File, off, n int64)

	// foreign holds paths of non-blob files already logged by List.
	foreign sync.Map
}

// ReadOnly implements engines.ReadOnly.
func (e *Engine) ReadOnly() bool { return e.ro }

var (
	_ engines.ReadOnly       = (*Engine)(nil)
	_ engines.Large          = (*Engine)(nil)
	_ engines.StatFS         = (*Engine)(nil)
	_ engines.ResidueCounter = (*Engine)(nil)
	_ engines.DeleteSafe     = (*Engine)(nil)
)

// Open opens (creating if needed) the store under dir and removes stage
// files left by a crash. log may be nil.
func Open(ctx context.Context, dir string, log *slog.Logger) (*Engine, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	e := &Engine{
		dir:      dir,
		blobDir:  filepath.Join(dir, "blobs"),
		stageDir: filepath.Join(dir, "stage"),
		sumsDir:  filepath.Join(dir, "sums"),
		log:      log,
		writeback: func(f *os.File, off, n int64) {
			startWriteback(f, off, n) // advisory: Commit's fsync reports errors
		},
	}
	if !engines.Writable(dir) {
		// Read-only media: read what is there; puts fail at their stage.
		if _, err := os.Stat(e.blobDir); err != nil {
			return nil, e.wrap("open", blob.Digest{}, err)
		}
		e.ro = true
		return e, nil
	}
	// Private: 0700 whatever existed before, so that no other user of the
	// host reads a blob (the directories under these inherit the closure).
	for _, d := range []string{e.blobDir, e.stageDir, e.sumsDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, e.wrap("open", blob.Digest{}, err)
		}
	}
	for _, d := range []string{dir, e.blobDir, e.stageDir, e.sumsDir} {
		if err := os.Chmod(d, 0o700); err != nil {
			return nil, e.wrap("open", blob.Digest{}, err)
		}
	}
	removed, inUse, err := e.removeStale(ctx)
	if removed > 0 || inUse > 0 {
		log.Info("removed stale stage files", "count", removed, "in_use", inUse, "dir", e.stageDir)
	}
	if err != nil {
		return nil, e.wrap("open", blob.Digest{}, fmt.Errorf("removing stale stage files: %w", err))
	}
	return e, nil
}

// removeStale removes every stage file that no live stage holds locked.
func (e *Engine) removeStale(ctx context.Context) (removed, inUse int, err error) {
	ents, err := os.ReadDir(e.stageDir)
	if err != nil {
		return 0, 0, err
	}
	for _, de := range ents {
		if err := ctx.Err(); err != nil {
			return removed, inUse, err
		}
		p := filepath.Join(e.stageDir, de.Name())
		if !de.Type().IsRegular() {
			e.log.Warn("skipping foreign entry in stage directory", "path", p)
			continue
		}
		ok, err := removeIfUnlocked(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			// Gone already: its stage ended, or another Open took it.
		case err != nil:
			return removed, inUse, err
		case ok:
			removed++
		default:
			inUse++
		}
	}
	return removed, inUse, nil
}

// Name implements engines.Engine: "local:" and the directory.
func (e *Engine) Name() string { return "local:" + e.dir }

// Root implements engines.StatFS.
func (e *Engine) Root() string { return e.dir }

// CursorsSurviveDelete implements engines.DeleteSafe: Delete unlinks, and
// an open descriptor keeps the inode.
func (e *Engine) CursorsSurviveDelete() bool { return true }

// Close implements engines.Engine. There is nothing to release.
func (e *Engine) Close() error { return nil }

func (e *Engine) shardDir(d blob.Digest) string {
	return filepath.Join(e.blobDir, d.String()[:2])
}

// Path is where d's file is (or would be): dir/blobs/ab/abcdef…. A cache
// in the local layout (engines/cache) locks and checks it.
func (e *Engine) Path(d blob.Digest) string { return e.path(d) }

func (e *Engine) path(d blob.Digest) string {
	s := d.String()
	return filepath.Join(e.blobDir, s[:2], s)
}

func (e *Engine) wrap(op string, d blob.Digest, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		err = blob.ErrMissing
	}
	return blob.Wrap(op, e.Name(), d, err)
}

// Has implements engines.Engine with a stat.
func (e *Engine) Has(ctx context.Context, d blob.Digest) (bool, error) {
	_, err := os.Stat(e.path(d))
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, fs.ErrNotExist):
		return false, nil
	}
	return false, e.wrap("has", d, err)
}

// Size implements engines.Engine with a stat.
func (e *Engine) Size(ctx context.Context, d blob.Digest) (int64, error) {
	fi, err := os.Stat(e.path(d))
	if err != nil {
		return 0, e.wrap("size", d, err)
	}
	return fi.Size(), nil
}

// Open implements engines.Engine. The cursor is an engines.FileCursor.
func (e *Engine) Open(ctx context.Context, d blob.Digest) (engines.Cursor, error) {
	f, err := os.Open(e.path(d))
	if err != nil {
		return nil, e.wrap("open", d, err)
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, e.wrap("open", d, err)
	}
	return &cursor{e: e, d: d, f: f, size: fi.Size()}, nil
}

// Delete implements engines.Engine. Shard directories stay: removing one
// would race a Commit that just created it.
func (e *Engine) Delete(ctx context.Context, d blob.Digest) error {
	if err := os.Remove(e.path(d)); err != nil {
		return e.wrap("delete", d, err)
	}
	e.removeSidecar(d)
	return nil
}

// StageResidue implements engines.ResidueCounter: the files in the stage
// directory (of every process using it).
func (e *Engine) StageResidue(ctx context.Context) (int, error) {
	ents, err := os.ReadDir(e.stageDir)
	if err != nil {
		return 0, e.wrap("stage residue", blob.Digest{}, err)
	}
	return len(ents), nil
}

// syncDir makes a directory's entries durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
