package local

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"iter"
	"os"
	"path/filepath"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// List implements engines.Engine. It reads one shard directory at a time
// (os.ReadDir sorts it) and holds nothing while the caller's loop runs.
func (e *Engine) List(ctx context.Context, after blob.Digest) iter.Seq2[engines.Entry, error] {
	return func(yield func(engines.Entry, error) bool) {
		first := 0
		if !after.IsZero() {
			first = int(after[0])
		}
		for shard := first; shard < 256; shard++ {
			if err := ctx.Err(); err != nil {
				yield(engines.Entry{}, e.wrap("list", after, err))
				return
			}
			page, err := e.readShard(shard, after)
			if err != nil {
				yield(engines.Entry{}, e.wrap("list", after, err))
				return
			}
			for _, en := range page {
				if !yield(en, nil) {
					return
				}
			}
		}
	}
}

// readShard lists one shard's blobs above after (all of them when after is
// zero), in order.
func (e *Engine) readShard(shard int, after blob.Digest) ([]engines.Entry, error) {
	prefix := fmt.Sprintf("%02x", shard)
	dir := filepath.Join(e.blobDir, prefix)
	des, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var page []engines.Entry
	for _, de := range des {
		name := de.Name()
		if !blob.IsDigestName(name) || name[:2] != prefix || !de.Type().IsRegular() {
			e.skipForeign(filepath.Join(dir, name))
			continue
		}
		d, err := blob.Parse(name)
		if err != nil {
			return nil, err // IsDigestName said it parses
		}
		if !after.IsZero() && d.Compare(after) <= 0 {
			continue
		}
		fi, err := de.Info()
		if errors.Is(err, fs.ErrNotExist) {
			continue // deleted since ReadDir
		}
		if err != nil {
			return nil, err
		}
		page = append(page, engines.Entry{Digest: d, Size: fi.Size()})
	}
	return page, nil
}

// skipForeign logs a file that is not a blob, once per path.
func (e *Engine) skipForeign(path string) {
	if _, seen := e.foreign.LoadOrStore(path, struct{}{}); !seen {
		e.log.Warn("skipping foreign file in blob directory", "path", path)
	}
}
