package meta

import (
	"context"
	"database/sql"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/blob"
)

// A dead process's close journal (journal.go), applied by whoever
// settles intents next; and the records' format on disk.

// ReplayDead applies what dead processes left in their segments, and
// returns how many records it applied. A segment whose process lives is
// locked, and skipped.
func (j *Journal) ReplayDead(ctx context.Context) (int, error) {
	if j == nil {
		return 0, nil
	}
	l := j.links.Load()
	if l == nil {
		return 0, nil // nothing to bind a record's rows to
	}
	j.replayMu.Lock()
	defer j.replayMu.Unlock()
	ents, err := os.ReadDir(j.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("close journal: %w", err)
	}
	own, _ := j.own.Load().(string)
	total := 0
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".new") {
			// A segment a crash caught between its creation and its
			// rename: it never held a record. A live one is that young
			// for microseconds.
			if info, err := e.Info(); err == nil && time.Since(info.ModTime()) > time.Minute {
				os.Remove(filepath.Join(j.dir, e.Name()))
			}
			continue
		}
		seg, ok := strings.CutSuffix(e.Name(), ".log")
		if !ok || seg == own || e.IsDir() {
			continue
		}
		n, err := j.replay(ctx, l, seg)
		total += n
		if err != nil {
			if ctx.Err() != nil {
				return total, ctx.Err()
			}
			// Kept, for a later replay (or a build that reads it): the
			// recoveries that called this go on without it; a removal's
			// drain refuses while it is kept (behind).
			j.log.Error("closes a dead process acknowledged cannot be applied yet; its journal segment is kept", "err", err)
		}
	}
	if total > 0 {
		j.log.Info("applied closes a process acknowledged before it stopped", "records", total)
	}
	return total, nil
}

// replay applies what is left of dead segment seg, in one transaction,
// then removes it.
func (j *Journal) replay(ctx context.Context, l *Links, seg string) (int, error) {
	path := j.segmentPath(seg)
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("close journal: %w", err)
	}
	defer f.Close()
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		return 0, nil // its process lives, or another replays it
	}
	// Locked: but the file may have been finished and removed between our
	// open and the lock, its mark with it. Only the file at the path now
	// is the segment.
	var held, now unix.Stat_t
	if unix.Fstat(int(f.Fd()), &held) != nil || unix.Stat(path, &now) != nil || held.Ino != now.Ino || held.Dev != now.Dev {
		return 0, nil
	}
	var mark int64
	err = j.markGet.QueryRowContext(ctx, seg).Scan(&mark)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return 0, fmt.Errorf("close journal %s: %w", path, err)
	}
	data, err := io.ReadAll(io.NewSectionReader(f, mark, 1<<62))
	if err != nil {
		return 0, fmt.Errorf("close journal %s: %w", path, err)
	}
	rs, rest, err := decodeRecords(data, seg, mark, l)
	if err != nil {
		// A whole record this build cannot read (a newer build's): keep
		// the segment for one that can.
		return 0, fmt.Errorf("close journal %s: %w; the segment is kept", path, err)
	}
	if rest > 0 {
		j.log.Warn("close journal: a torn record at the end of a dead process's segment is dropped (its close had not returned)",
			"segment", path, "bytes", rest)
	}
	if len(rs) > 0 {
		if err := j.applyAll(ctx, rs); err != nil {
			return 0, fmt.Errorf("close journal %s: apply a dead process's closes: %w", path, err)
		}
	}
	os.Remove(path)
	j.dropMark(ctx, seg)
	return len(rs), nil
}

// Record bodies: a version byte, a flags byte (link, intent, settle,
// pin), the digest, the pin row (owner, TTL), the link (namespace, size)
// or the intent (namespace, id, holder, TTL, size), the intent it
// replaces, then the value.
const (
	recLink = 1 << iota
	recIntent
	recSettle
	recPin
)

// encodeRecord appends r's header room and body to b.
func encodeRecord(b []byte, r *journalRec) []byte {
	b = append(b, make([]byte, recordHeader)...)
	var flags byte
	if r.ns.Link != nil {
		flags |= recLink
	}
	if r.ns.Intent != nil {
		flags |= recIntent
	}
	if r.ns.Settle {
		flags |= recSettle
	}
	if r.pin != nil {
		flags |= recPin
	}
	b = append(b, recordVersion, flags)
	b = append(b, r.d[:]...)
	str := func(s string) {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	if p := r.pin; p != nil {
		str(p.Owner)
		b = binary.AppendVarint(b, int64(p.TTL))
	}
	if k := r.ns.Link; k != nil {
		str(k.NS)
		b = binary.AppendVarint(b, k.Size)
	}
	if i := r.ns.Intent; i != nil {
		str(i.NS)
		b = binary.LittleEndian.AppendUint64(b, uint64(i.ID))
		str(i.Holder)
		b = binary.AppendVarint(b, int64(i.TTL))
		b = binary.AppendVarint(b, i.Size)
	}
	b = binary.AppendVarint(b, r.ns.Replaces)
	return append(b, r.value...)
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// decodeRecords parses the records of data, which starts at offset base
// of segment seg, binding their rows to l; rest is how many bytes at the
// end are not a whole record with its checksum (a write a crash tore).
// A whole record that does not decode is an error: it is no tear.
func decodeRecords(data []byte, seg string, base int64, l *Links) (rs []*journalRec, rest int, err error) {
	off := 0
	for len(data)-off >= recordHeader {
		n := int(binary.LittleEndian.Uint32(data[off:]))
		sum := binary.LittleEndian.Uint32(data[off+4:])
		if n > len(data)-off-recordHeader || n < 2+len(blob.Digest{}) {
			// Short: torn. Too small to be a record: zeros a power loss
			// left where the file grew (the CRC of nothing is 0).
			break
		}
		body := data[off+recordHeader : off+recordHeader+n]
		if crc32.Checksum(body, castagnoli) != sum {
			break
		}
		r, ok := decodeBody(body, l)
		if !ok {
			return nil, 0, fmt.Errorf("the record at %d does not decode (version %d)", base+int64(off), body[0])
		}
		r.seg, r.start, r.end = seg, base+int64(off), base+int64(off+recordHeader+n)
		rs = append(rs, r)
		off += recordHeader + n
	}
	return rs, len(data) - off, nil
}

// decodeBody is encodeRecord's inverse.
func decodeBody(b []byte, l *Links) (*journalRec, bool) {
	bad := false
	take := func(n int) []byte {
		if bad || n < 0 || n > len(b) {
			bad = true
			return nil
		}
		v := b[:n]
		b = b[n:]
		return v
	}
	varint := func() int64 {
		if bad {
			return 0
		}
		v, n := binary.Varint(b)
		if n <= 0 {
			bad = true
			return 0
		}
		b = b[n:]
		return v
	}
	str := func() string {
		if bad {
			return ""
		}
		v, n := binary.Uvarint(b)
		if n <= 0 {
			bad = true
			return ""
		}
		b = b[n:]
		return string(take(int(v)))
	}
	head := take(2)
	if bad || head[0] != recordVersion {
		return nil, false
	}
	flags := head[1]
	r := &journalRec{}
	copy(r.d[:], take(len(r.d)))
	if flags&recPin != 0 {
		r.pin = &PinRow{D: r.d}
		r.pin.Owner = str()
		r.pin.TTL = time.Duration(varint())
	}
	if flags&recLink != 0 {
		r.ns.Link = &LinkRow{D: r.d}
		r.ns.Link.NS = str()
		r.ns.Link.Size = varint()
	}
	if flags&recIntent != 0 {
		i := &IntentRow{D: r.d}
		i.NS = str()
		if id := take(8); !bad {
			i.ID = int64(binary.LittleEndian.Uint64(id))
		}
		i.Holder = str()
		i.TTL = time.Duration(varint())
		i.Size = varint()
		r.ns.Intent = i
	}
	r.ns.Settle = flags&recSettle != 0
	r.ns.Replaces = varint()
	if bad {
		return nil, false
	}
	r.value = b
	r.ns = l.Rows(r.ns)
	r.ns.admitted = true
	return r, r.ns.Check() == nil
}
