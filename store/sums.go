package store

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
)

// Chunk checksums let a range read of a large blob verify only the chunks
// it touches, instead of hashing from offset 0. They are CRC-32C per 64 KiB
// chunk, computed at publish in the same pass as the sha256 (CRC-32C runs
// at memory speed with SSE4.2, so publish pays almost nothing) and kept in
// the large engine's sidecar. They guard against the medium — bit rot, a
// torn or flipped byte — not against an adversary who can rewrite both the
// blob and its sidecar; the end-to-end sha256 is checked by every read from
// offset 0 to EOF and by `alkblobfs verify`.
const (
	chunkSize   = 64 << 10
	sumsVersion = 1
	sumsHeader  = 8 // version byte, 3 reserved, chunk size uint32
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// contentHash computes a blob's sha256 and its chunk checksums in one pass.
type contentHash struct {
	sha  hash.Hash
	sums []uint32
	cur  uint32 // running CRC of the partial chunk
	curN int    // bytes in the partial chunk
	n    int64
}

func newContentHash() *contentHash { return &contentHash{sha: sha256.New()} }

func (h *contentHash) Write(p []byte) (int, error) {
	h.writeSHA(p)
	h.writeSums(p)
	return 0, nil
}

// writeSHA feeds the sha256 only, and writeSums the chunk checksums only.
// Two goroutines may feed one each, in content order (the hash pipe and
// the stage writer: shaOnly), since they touch different fields; the
// sha256 alone then sets the pace of a large put on its core.
func (h *contentHash) writeSHA(p []byte) {
	h.sha.Write(p)
	h.n += int64(len(p))
}

func (h *contentHash) writeSums(p []byte) {
	for len(p) > 0 {
		k := min(len(p), chunkSize-h.curN)
		h.cur = crc32.Update(h.cur, castagnoli, p[:k])
		h.curN += k
		p = p[k:]
		if h.curN == chunkSize {
			h.sums = append(h.sums, h.cur)
			h.cur, h.curN = 0, 0
		}
	}
}

// shaOnly is h as the writer of a hash pipe whose chunk checksums are fed
// elsewhere (by writeSums).
type shaOnly struct{ h *contentHash }

func (w shaOnly) Write(p []byte) (int, error) {
	w.h.writeSHA(p)
	return len(p), nil
}

func (h *contentHash) digest() Digest {
	var d Digest
	h.sha.Sum(d[:0])
	return d
}

// sidecar encodes the checksums, including the partial last chunk.
func (h *contentHash) sidecar() []byte {
	n := len(h.sums)
	if h.curN > 0 {
		n++
	}
	b := make([]byte, sumsHeader+4*n)
	b[0] = sumsVersion
	binary.LittleEndian.PutUint32(b[4:], chunkSize)
	for i, s := range h.sums {
		binary.LittleEndian.PutUint32(b[sumsHeader+4*i:], s)
	}
	if h.curN > 0 {
		binary.LittleEndian.PutUint32(b[sumsHeader+4*len(h.sums):], h.cur)
	}
	return b
}

// chunkSums is a decoded sidecar.
type chunkSums []uint32

var errBadSidecar = errors.New("malformed chunk checksums")

func parseSums(b []byte, size int64) (chunkSums, error) {
	want := (size + chunkSize - 1) / chunkSize
	if len(b) < sumsHeader || b[0] != sumsVersion || binary.LittleEndian.Uint32(b[4:]) != chunkSize ||
		int64(len(b)-sumsHeader) != 4*want {
		return nil, fmt.Errorf("%w: %d bytes for a %d-byte blob", errBadSidecar, len(b), size)
	}
	s := make(chunkSums, want)
	for i := range s {
		s[i] = binary.LittleEndian.Uint32(b[sumsHeader+4*i:])
	}
	return s, nil
}

func (s chunkSums) check(i int64, data []byte) bool {
	return crc32.Checksum(data, castagnoli) == s[i]
}

// hashPipe feeds a hash on its own goroutine, so that hashing a large put
// or read overlaps with its I/O: on two cores a 1 GiB put then costs about
// max(I/O, hash) instead of their sum. Write copies p (callers reuse their
// buffers), so it blocks only when the hash falls pipeDepth MiB behind;
// give hands a buffer over without a copy, share a buffer that the stage
// writer reads too, and zeros a run of zeros by its length (a hole is
// hashed without being read).
//
// A nil pipe hashes nothing: give puts the buffer back at once, zeros and
// wait do nothing.
type hashPipe struct {
	w    io.Writer
	ch   chan hashItem
	done chan struct{}
	n    int64 // bytes handed over by Write
	shut bool
}

// hashItem is a buffer, released once hashed, or else a run of zeros.
type hashItem struct {
	buf   *sharedBuf
	zeros int64
}

const pipeDepth = 8

func newHashPipe(w io.Writer) *hashPipe {
	p := &hashPipe{w: w, ch: make(chan hashItem, pipeDepth), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for it := range p.ch {
			if b := it.buf; b != nil {
				p.w.Write(b.bytes())
				b.release()
				continue
			}
			for n := it.zeros; n > 0; {
				k := min(n, int64(len(zeroBlock)))
				p.w.Write(zeroBlock[:k])
				n -= k
			}
		}
	}()
	return p
}

func (p *hashPipe) Write(b []byte) (int, error) {
	n := len(b)
	p.n += int64(n)
	for len(b) > 0 {
		bp := copyBufs.Get().(*[]byte)
		k := copy(*bp, b)
		p.ch <- hashItem{buf: newSharedBuf(bp, k, 1)}
		b = b[k:]
	}
	return n, nil
}

// give hashes the first n bytes of *bp, a buffer of copyBufs, and puts it
// back there once hashed.
func (p *hashPipe) give(bp *[]byte, n int) {
	if p == nil {
		copyBufs.Put(bp)
		return
	}
	p.ch <- hashItem{buf: newSharedBuf(bp, n, 1)}
}

// share hashes b's bytes and then releases b.
func (p *hashPipe) share(b *sharedBuf) {
	p.n += int64(b.n)
	p.ch <- hashItem{buf: b}
}

// zeros hashes n zero bytes.
func (p *hashPipe) zeros(n int64) {
	if p != nil {
		p.ch <- hashItem{zeros: n}
	}
}

// wait lets the hash catch up and stops the goroutine. Idempotent; no
// Write may follow.
func (p *hashPipe) wait() {
	if p == nil {
		return
	}
	if !p.shut {
		p.shut = true
		close(p.ch)
	}
	<-p.done
}
