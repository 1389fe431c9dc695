package store

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"sync"

	"github.com/alkblobfs/alkblobfs/blob"
)

// An upload seeded with a large blob (Seed) does not copy it. The blob is
// its base: a byte below baseLen comes from the base unless the 64 KiB
// chunk holding it has been copied up into the stage (mat), which a write
// into part of a chunk does first. Bytes from baseLen on live in the
// stage, like those of any upload. Commit copies the chunks still in the
// base into the stage in the same pass that hashes the content, so that
// opening a 1 GiB file for `>>` costs no more than creating a stage file,
// and the copy is paid once, by the close that publishes.
//
// Holes are kept on the way: the pass asks the stage and the base where
// their data is (SEEK_DATA, through dataSeeker) and hashes zeros for a
// hole without reading it or writing it, so a sparse file stays sparse and
// costs only its data in I/O.

// dataSeeker is implemented by the local engine's stages and cursors.
// SeekData returns the first region of data at or after off, [start, end),
// or io.EOF when only a hole follows off. Any other error means that the
// medium cannot tell: everything is data.
type dataSeeker interface {
	SeekData(off int64) (start, end int64, err error)
}

// zeroBlock is what a hole hashes as. Never written, it takes no memory
// until read, and then only the kernel's zero page.
var zeroBlock [copyBufSize]byte

// zeroChunkSum is the recorded checksum of a 64 KiB chunk of zeros.
var zeroChunkSum = sync.OnceValue(func() uint32 { return crc32.Checksum(zeroBlock[:chunkSize], castagnoli) })

func zeroSum(n int64) uint32 {
	if n == chunkSize {
		return zeroChunkSum()
	}
	return crc32.Checksum(zeroBlock[:n], castagnoli)
}

func allZero(b []byte) bool {
	for len(b) > 0 {
		k := min(len(b), len(zeroBlock))
		if string(b[:k]) != string(zeroBlock[:k]) {
			return false
		}
		b = b[k:]
	}
	return true
}

// Seed makes an empty upload start from the content of r's blob, the way
// opening a file for writing without O_TRUNC keeps what it holds. A small
// blob is copied in. A large one is not: the upload reads it where it has
// not been written, and Commit copies the rest while it hashes (see
// above), so Seed returns in the time it takes to create a stage file.
//
// The upload keeps r and pin (which may be nil) until it ends, so that a
// sweep cannot take the blob while the upload still reads it; Seed takes
// them over in every case, closing both itself if it fails. r verifies
// what the upload reads of it unless the caller trusted it (Reader.Trust).
func (u *Upload) Seed(ctx context.Context, r *Reader, pin *Pin) error {
	release := func() {
		r.Close()
		if pin != nil {
			pin.Release()
		}
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	switch {
	case u.done:
		release()
		return os.ErrClosed
	case u.size != 0 || u.base != nil:
		release()
		return errors.New("upload: seed of an upload that has content")
	}
	n := r.Len()
	if n == 0 {
		release()
		return nil
	}
	if r.tier == TierKV || n <= u.s.threshold {
		// Small: copy it in from offset 0, so that it stays in memory and
		// keeps being hashed as it is written.
		defer release()
		b := make([]byte, n)
		if k, err := r.ReadAt(b, 0); int64(k) != n {
			if err == nil || errors.Is(err, io.EOF) {
				err = blob.Wrap("seed", r.engine, r.d, io.ErrUnexpectedEOF)
			}
			return err
		}
		_, err := u.writeAtLocked(b, 0)
		return err
	}
	if u.st == nil {
		if err := u.spill(ctx); err != nil {
			release()
			return err
		}
	}
	// The stage is as long as the content from the start, holes where the
	// base still holds it; nothing of it was hashed.
	u.stopHash()
	u.seq = false
	if err := u.st.Truncate(n); err != nil {
		release()
		return err
	}
	u.base, u.basePin, u.baseLen, u.size = r, pin, n, n
	u.mat = make([]uint64, (n+64*chunkSize-1)/(64*chunkSize))
	return nil
}

// dropBase lets go of the seed blob: it is no longer needed.
func (u *Upload) dropBase() {
	if u.base == nil {
		return
	}
	u.base.Close()
	if u.basePin != nil {
		u.basePin.Release()
	}
	u.base, u.basePin, u.baseLen, u.mat = nil, nil, 0, nil
}

func (u *Upload) isMat(i int64) bool { return u.mat[i/64]&(1<<(i%64)) != 0 }
func (u *Upload) setMat(i int64)     { u.mat[i/64] |= 1 << (i % 64) }

// runAt returns where the run of content starting at off that one source
// holds ends, and whether that source is the base (else the stage).
func (u *Upload) runAt(off int64) (end int64, fromBase bool) {
	if u.base == nil || off >= u.baseLen {
		return u.size, false
	}
	chunks := (u.baseLen + chunkSize - 1) / chunkSize
	i := off / chunkSize
	m := u.isMat(i)
	for i++; i < chunks; {
		if i%64 == 0 && i+64 <= chunks {
			if w := u.mat[i/64]; m && w == ^uint64(0) || !m && w == 0 {
				i += 64
				continue
			}
		}
		if u.isMat(i) != m {
			break
		}
		i++
	}
	return min(i*chunkSize, u.baseLen), !m
}

// copyUp makes the base's chunks that a write of [off, end) touches live
// in the stage: a chunk the write covers only partly is copied first (a
// chunk of zeros is left a hole).
func (u *Upload) copyUp(off, end int64) error {
	end = min(end, u.baseLen)
	for i := off / chunkSize; i*chunkSize < end; i++ {
		if u.isMat(i) {
			continue
		}
		lo, hi := i*chunkSize, min((i+1)*chunkSize, u.baseLen)
		if off > lo || end < hi {
			bp := spanBufs.Get().(*[]byte)
			b := (*bp)[:hi-lo]
			err := readFull(u.base, b, lo)
			if err == nil && !allZero(b) {
				_, err = u.st.WriteAt(b, lo)
			}
			spanBufs.Put(bp)
			if err != nil {
				return err
			}
		}
		u.setMat(i)
	}
	return nil
}

// readFull reads len(p) bytes at off or fails.
func readFull(r io.ReaderAt, p []byte, off int64) error {
	n, err := r.ReadAt(p, off)
	if n == len(p) {
		return nil
	}
	if err == nil || errors.Is(err, io.EOF) {
		err = fmt.Errorf("at %d: %w", off+int64(n), io.ErrUnexpectedEOF)
	}
	return err
}

// readLocked reads the content at off: the base where it still holds it,
// the stage elsewhere.
func (u *Upload) readLocked(p []byte, off int64) (int, error) {
	if u.base == nil {
		return u.st.ReadAt(p, off)
	}
	if off < 0 {
		return 0, fmt.Errorf("upload: negative offset %d", off)
	}
	if off >= u.size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), u.size-off)
	for k := int64(0); k < n; {
		end, fromBase := u.runAt(off + k)
		m := min(end-off-k, n-k)
		var src io.ReaderAt = u.st
		if fromBase {
			src = u.base
		}
		if err := readFull(src, p[k:k+m], off+k); err != nil {
			return int(k), err
		}
		k += m
	}
	if n < int64(len(p)) {
		return int(n), io.EOF
	}
	return int(n), nil
}

// lockedReader reads an upload whose lock its caller holds.
type lockedReader struct{ u *Upload }

func (r lockedReader) ReadAt(p []byte, off int64) (int, error) { return r.u.readLocked(p, off) }

// settle makes the stage hold the whole content, copying in what is still
// in the base, and (with hashIt) hashes the content in the same pass. It
// reads only data: a hole of the stage or of the base is hashed as zeros,
// and stays a hole.
func (u *Upload) settle(ctx context.Context, hashIt bool) (*contentHash, error) {
	var h *contentHash
	var q *hashPipe // nil: no hash
	if hashIt {
		h = newContentHash()
		q = newHashPipe(h)
		defer q.wait()
	}
	stage := extents{s: asSeeker(u.st)}
	var base extents
	if u.base != nil {
		base.s = asSeeker(u.base.cur)
		if v := u.base.v; v != nil && v.sums == nil && base.s != nil {
			// No chunk checksums: a hole can be taken for zeros only once
			// the whole blob is known good.
			if err := v.hashAll(); err != nil {
				return nil, err
			}
		}
	}
	for off := int64(0); off < u.size; {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		end, fromBase := u.runAt(off)
		x, src := &stage, io.ReaderAt(u.st)
		if fromBase {
			x, src = &base, u.base
		}
		a, b := x.data(off, end)
		if fromBase && a > off {
			if s := u.zerosInBase(off, a); s < a {
				if s == off { // read up to the next chunk: it is checked
					a, b = off, min((off/chunkSize+1)*chunkSize, a)
				} else {
					a, b = s, s
				}
			}
		}
		if a > off {
			q.zeros(a - off)
			off = a
			continue
		}
		bp := copyBufs.Get().(*[]byte)
		p := (*bp)[:min(b-off, int64(len(*bp)))]
		err := readFull(src, p, off)
		if err == nil && fromBase && !allZero(p) { // the stage is a hole there
			_, err = u.st.WriteAt(p, off)
		}
		if err != nil {
			copyBufs.Put(bp)
			return nil, fmt.Errorf("upload: settle at %d: %w", off, err)
		}
		q.give(bp, len(p)) // the pipe puts bp back
		off += int64(len(p))
	}
	q.wait()
	return h, nil
}

// zerosInBase returns how much of the base's hole [off, a) may be hashed
// as zeros without reading it: all of it when the base's reads are not
// checked (or the whole blob was), else the whole chunks from off whose
// recorded checksum is that of zeros. A chunk whose checksum is not (the
// file lost data, or was never sparse there) is read, and its check fails
// there.
func (u *Upload) zerosInBase(off, a int64) int64 {
	v := u.base.v
	switch {
	case v == nil || v.sums == nil && v.good.Load():
		return a
	case v.sums == nil || off%chunkSize != 0:
		return off
	}
	e := off
	for i := off / chunkSize; e < a; i++ {
		ce := min(e+chunkSize, u.base.size)
		if ce > a || v.sums[i] != zeroSum(ce-e) {
			break
		}
		e = ce
	}
	return e
}

func asSeeker(x any) dataSeeker {
	s, _ := x.(dataSeeker)
	return s
}

// extents walks the data regions of one source at increasing offsets,
// asking it once per region.
type extents struct {
	s          dataSeeker // nil: all data
	ok         bool       // at, start, end, none answer a query
	at         int64      // the offset asked
	start, end int64      // the first data region at or after at
	none       bool       // no data at or after at
}

// data returns the first data region within [off, lim), or (lim, lim) if
// there is none.
func (x *extents) data(off, lim int64) (int64, int64) {
	if x.s == nil {
		return off, lim
	}
	if !x.ok || off < x.at || !x.none && off >= x.end {
		start, end, err := x.s.SeekData(off)
		switch {
		case errors.Is(err, io.EOF):
			x.none = true
		case err != nil || end <= start:
			x.s = nil // cannot tell: all data from here
			return off, lim
		default:
			x.none, x.start, x.end = false, start, end
		}
		x.ok, x.at = true, off
	}
	if x.none {
		return lim, lim
	}
	a := max(off, x.start)
	if a >= lim {
		return lim, lim
	}
	return a, min(x.end, lim)
}

// writeSparse writes b at off in st, skipping 4 KiB blocks of zeros: st
// is new, so what is skipped reads as zeros, and takes no disk.
func writeSparse(st io.WriterAt, b []byte, off int64) error {
	const blk = 4 << 10
	for i := 0; i < len(b); {
		j := i
		for j < len(b) && !allZero(b[j:min(j+blk, len(b))]) {
			j = min(j+blk, len(b))
		}
		if j > i {
			if _, err := st.WriteAt(b[i:j], off+int64(i)); err != nil {
				return err
			}
			i = j
			continue
		}
		i = min(i+blk, len(b))
	}
	return nil
}
