package cache

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// A fill's stage is DIR/stage/stage-DIGEST, held under an exclusive flock
// by its process for the whole fill. The name makes the flock a claim on
// the blob's fill for every process of the host: a process that misses a
// blob whose stage another holds waits for it (claim) instead of fetching
// the blob a second time, and then opens the published copy. The name
// starts with "stage-" and the file is locked as engines/local's stages
// are, so the stage sweep at open (engines/local) removes the stage of a
// fill cut by kill -9, and never a live one.

// errBusy: another process's fill of the blob did not end in time; the
// caller reads from the remote tier without filling.
var errBusy = errors.New("another process of the host is filling the blob and made no progress in time")

// claimPoll is how often a waiting miss tries the claim again.
const claimPoll = 20 * time.Millisecond

// claimMax bounds a wait whatever the progress.
const claimMax = 10 * time.Minute

func (e *Engine) stagePath(d blob.Digest) string {
	return filepath.Join(e.dir, "stage", "stage-"+d.String())
}

// claim makes this process the host's filler of d: it returns d's stage,
// locked, size bytes long and empty (a hole). If a fill of d in this process holds the claim, claim
// returns a cursor on it. If another process holds it, claim waits while
// that fill makes progress (its stage grows) and returns the copy it
// published as a hit cursor; when that fill fails or its process dies,
// the claim passes to this one. It gives up with errBusy when the other
// fill stalls for the engine's wait (Options.FillWait) or runs past
// claimMax, and returns a hit if d was published meanwhile by other means
// (a put's write-through).
func (e *Engine) claim(ctx context.Context, d blob.Digest, size int64) (*stageFile, engines.Cursor, error) {
	path := e.stagePath(d)
	start := time.Now()
	lastGrowth, lastBlocks := start, int64(-1)
	waited := false
	for {
		if c, ok := e.openHit(ctx, d); ok {
			return nil, c, nil
		}
		fh, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, nil, fmt.Errorf("cache stage: %w", err)
		}
		err = unix.Flock(int(fh.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			if !namesFile(path, fh) {
				fh.Close() // the name went (a fill ended, a sweep) after our open
				continue
			}
			if c, ok := e.openHit(ctx, d); ok {
				// Published between the first look and the lock.
				os.Remove(path)
				fh.Close()
				return nil, c, nil
			}
			if e.copyLocked(d) {
				// Not a miss: a copy is there, locked. Its filler is
				// publishing it (the copy is the stage's inode, which it
				// holds locked from the removal of the stage's name,
				// which let this process claim a new one, until it
				// closes it), or an eviction is taking it. Give the
				// claim back and look again.
				os.Remove(path)
				fh.Close()
				if time.Since(start) > claimMax {
					return nil, nil, errBusy
				}
				if err := e.pollWait(ctx); err != nil {
					return nil, nil, err
				}
				continue
			}
			err := fh.Truncate(0) // a dead filler's bytes
			if err == nil {
				err = fh.Truncate(size)
			}
			if err != nil {
				os.Remove(path)
				fh.Close()
				return nil, nil, fmt.Errorf("cache stage: %w", err)
			}
			if waited {
				e.log.Debug("cache: the other process's fill ended without a copy; filling here", "digest", d.String())
			}
			return &stageFile{f: fh, path: path}, nil, nil
		}
		if !errors.Is(err, unix.EWOULDBLOCK) {
			fh.Close()
			return nil, nil, fmt.Errorf("cache stage: lock: %w", err)
		}
		if c := e.join(d); c != nil {
			// The claim is this process's own fill: join it.
			fh.Close()
			return nil, c, nil
		}
		if !waited {
			waited = true
			e.log.Debug("cache: another process is filling this blob; waiting for its copy", "digest", d.String())
		}
		var st unix.Stat_t
		if unix.Fstat(int(fh.Fd()), &st) == nil && st.Blocks != lastBlocks {
			lastBlocks, lastGrowth = st.Blocks, time.Now()
		}
		fh.Close()
		if time.Since(lastGrowth) > e.wait || time.Since(start) > claimMax {
			return nil, nil, errBusy
		}
		if err := e.pollWait(ctx); err != nil {
			return nil, nil, err
		}
	}
}

// pollWait waits claimPoll before a claim looks again, or until ctx or
// the engine ends.
func (e *Engine) pollWait(ctx context.Context) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-e.ctx.Done():
		return context.Canceled
	case <-time.After(claimPoll):
		return nil
	}
}

// copyLocked reports whether d's copy is there under an exclusive lock
// (openHit then misses it): being published or evicted by a process.
func (e *Engine) copyLocked(d blob.Digest) bool {
	f, err := os.Open(e.loc.Path(d))
	if err != nil {
		return false
	}
	defer f.Close()
	err = unix.Flock(int(f.Fd()), unix.LOCK_SH|unix.LOCK_NB)
	if err == nil {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
	}
	return errors.Is(err, unix.EWOULDBLOCK)
}

// namesFile reports whether path is f's file.
func namesFile(path string, f *os.File) bool {
	var mine, there unix.Stat_t
	if unix.Fstat(int(f.Fd()), &mine) != nil || unix.Stat(path, &there) != nil {
		return false
	}
	return mine.Dev == there.Dev && mine.Ino == there.Ino
}

// stageFile is a claimed fill's stage (see claim).
type stageFile struct {
	f    *os.File
	path string
}

// WriteAt writes a segment and starts its writeback, so that the fsync
// of the publish finds little left to write (as engines/local's stages).
func (s *stageFile) WriteAt(p []byte, off int64) (int, error) {
	n, err := s.f.WriteAt(p, off)
	if n > 0 {
		_ = unix.SyncFileRange(int(s.f.Fd()), off, int64(n), unix.SYNC_FILE_RANGE_WRITE)
	}
	return n, err
}

func (s *stageFile) ReadAt(p []byte, off int64) (int, error) { return s.f.ReadAt(p, off) }

// discard removes the stage and releases the claim.
func (s *stageFile) discard() {
	os.Remove(s.path)
	s.f.Close()
}

// publish links the stage's file in as d's copy (engines/local's Link:
// the sidecar, read-only, fsync, a link that never replaces), then
// removes the stage's name and releases the claim: a process waiting for
// the claim finds the copy when it gets it. linked is false when another
// copy of d was there first (a put's write-through); the stage is then
// dropped. id is the published file's identity after its last change
// here (the link and the unlink both change its ctime).
func (s *stageFile) publish(ctx context.Context, e *Engine, d blob.Digest, side []byte, size int64) (linked bool, id engines.FileID, err error) {
	defer s.f.Close()
	linked, err = e.loc.Link(ctx, d, s.f, side)
	if linked {
		// Indexed even if the directory's fsync failed: the name is there.
		if ierr := e.idx.add(ctx, d, size); ierr != nil {
			err = errors.Join(err, ierr)
		}
	}
	os.Remove(s.path)
	if linked {
		id, _ = engines.FileIDOf(s.f) // the zero FileID if it fails: no verdict
	}
	return linked, id, err
}

// inFlight sums the fills in flight on the host, in every process, but
// the one whose stage is skip: size, their blobs' bytes (each stage is
// sized to its blob by its claim), and unwritten, the bytes their fills
// have yet to write to the cache's disk (the stage's holes). A stage
// counts while its filler holds its lock: a stage a killed process left
// (removed at the next open) does not. It reads the stage directory:
// time in proportion to the fills in flight, not to the cache.
func (e *Engine) inFlight(skip string) (size, unwritten int64, err error) {
	dir := filepath.Join(e.dir, "stage")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, 0, fmt.Errorf("cache stage: %w", err)
	}
	for _, ent := range ents {
		name := ent.Name()
		path := filepath.Join(dir, name)
		if d, ok := strings.CutPrefix(name, "stage-"); !ok || path == skip || !isDigest(d) {
			continue
		}
		n, alloc, live := liveStage(path)
		if live {
			size += n
			unwritten += max(0, n-alloc)
		}
	}
	return size, unwritten, nil
}

func isDigest(s string) bool {
	_, err := blob.Parse(s)
	return err == nil
}

// liveStage reports whether a fill holds the stage at path (its flock)
// and, if so, the stage's size and the bytes allocated to it. The probe
// takes a shared lock for an instant: a process claiming that very stage
// meanwhile finds it held and polls again (claimPoll).
func liveStage(path string) (size, alloc int64, live bool) {
	fh, err := os.Open(path)
	if err != nil {
		return 0, 0, false // gone: the fill ended
	}
	defer fh.Close()
	if err := unix.Flock(int(fh.Fd()), unix.LOCK_SH|unix.LOCK_NB); err == nil {
		return 0, 0, false // nobody's fill (the close drops the probe's lock)
	}
	var st unix.Stat_t
	if unix.Fstat(int(fh.Fd()), &st) != nil {
		return 0, 0, false
	}
	return st.Size, st.Blocks * 512, true
}
