package fusefs

import (
	"context"
	"sync"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// streamPage is how many references one registry call reads: one
// namespaces page, so a listing of any size holds ~40 KiB of it at a time.
const streamPage = 1000

// refreshAge is how long after a listing that gave the kernel the
// attributes of every entry later listings leave them out for entries the
// kernel knows: half the entries' timeout, so that none lapses.
const refreshAge = blobTimeout / 2

// errLeaveOut, returned by nsStream.Lookup, makes go-fuse answer the entry
// of READDIRPLUS with node id 0, which the kernel takes as "no attributes
// for this entry" (fuse_direntplus_link) and lists as a plain entry.
const errLeaveOut = syscall.EEXIST

// nsStream lists a namespace a page at a time: "incoming", then every
// referenced digest in ascending order. Each page is a fresh Entries call
// from the last digest seen, so no registry state (lock, transaction,
// goroutine) is held between READDIR requests, and a million entries list
// in constant memory.
//
// It also answers READDIRPLUS lookups for the entry it just produced from
// the page (FileLookuper), sparing a registry round trip per entry.
//
// Unless the stream is full, an entry the kernel knows already (the
// namespace has its inode) gets no attributes: Lookup fails on purpose
// (go-fuse's FileLookuper would have the known child returned), and go-fuse
// then answers the entry with node id 0, which the kernel lists as a plain
// entry and links to nothing. The kernel keeps such an entry and its
// attributes for blobTimeout from when it last got them, so a warm ls -l
// needs nothing more from the daemon for it; go-fuse's lookup of it (its
// locks and tables, about 160 bytes of garbage) and the kernel's refresh
// of it are spared, and the kernel tends to ask for the next pages without
// attributes at all.
//
// A stream is full when no listing gave the kernel every entry's
// attributes in the last refreshAge; it records that it did when it ends
// having supplied as many entries as it produced (a page the kernel asks
// for without attributes supplies none). An entry the kernel does not have
// after all (its dentry dropped while its inode lives on under another
// namespace), or a new one on a page asked for without attributes, is
// looked up when stat'ed. TestWarmListingLeavesOutKnownEntries checks that
// the listings show the same.
type nsStream struct {
	d     *nsDir
	start time.Time // when the listing was opened
	full  bool      // give the kernel the attributes of every entry

	mu       sync.Mutex
	produced int    // entries produced (since the last rewind)
	supplied int    // and looked up for READDIRPLUS
	off      uint64 // entries produced so far (the d_off of the last one)
	page     []namespaces.Ref
	names    []string // the page's digests in hex, encoded once
	i        int
	after    blob.Digest
	eof      bool
	last     namespaces.Ref
	lastN    string // last's name
	// infos holds the page's sizes and tiers, fetched in one StatMany so
	// that READDIRPLUS (ls -l) costs no store query per entry.
	infos   map[blob.Digest]store.Info
	unknown []blob.Digest // the page's digests the namespace has no inode for
}

var (
	_ = (fs.FileReaddirenter)((*nsStream)(nil))
	_ = (fs.FileLookuper)((*nsStream)(nil))
	_ = (fs.FileSeekdirer)((*nsStream)(nil))
	_ = (fs.FileReleasedirer)((*nsStream)(nil))
)

func (s *nsStream) Readdirent(ctx context.Context) (*fuse.DirEntry, syscall.Errno) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.next()
}

func (s *nsStream) next() (*fuse.DirEntry, syscall.Errno) {
	if s.off == 0 {
		s.off = 1
		s.produced++
		return &fuse.DirEntry{Name: incomingName, Mode: syscall.S_IFDIR, Ino: s.d.inc.StableAttr().Ino, Off: 1}, 0
	}
	if s.i >= len(s.page) {
		if s.eof {
			s.ended()
			return nil, 0
		}
		if errno := s.fetch(); errno != 0 {
			return nil, errno
		}
		if len(s.page) == 0 {
			s.ended()
			return nil, 0
		}
	}
	ref, name := s.page[s.i], s.names[s.i]
	s.i++
	s.off++
	s.produced++
	s.last, s.lastN = ref, name
	return &fuse.DirEntry{Name: name, Mode: syscall.S_IFREG, Ino: blobAttr(ref.Digest).Ino, Off: s.off}, 0
}

func (s *nsStream) fetch() syscall.Errno {
	f := s.d.fsys
	page := s.page[:0]
	if page == nil {
		page = make([]namespaces.Ref, 0, streamPage)
	}
	for ref, err := range f.reg.Entries(f.ctx, s.d.name, s.after) {
		if err != nil {
			return f.errno("readdir", blob.Digest{}, err)
		}
		page = append(page, ref)
		if len(page) == streamPage {
			break
		}
	}
	s.page, s.i = page, 0
	s.eof = len(page) < streamPage
	// Blobs the kernel already knows have their size and tier in their
	// inode (blobChild answers from it): ask the store only for the rest,
	// so that a repeated ls -l queries nothing per entry.
	s.names, s.unknown, s.infos = s.names[:0], s.unknown[:0], nil
	for _, ref := range page {
		name, known := s.d.blobName(ref.Digest)
		s.names = append(s.names, name)
		if !known {
			s.unknown = append(s.unknown, ref.Digest)
		}
	}
	if len(s.unknown) > 0 {
		infos, err := f.st.StatMany(f.ctx, s.unknown)
		if err != nil {
			return f.errno("readdir", blob.Digest{}, err)
		}
		s.infos = infos
	}
	if len(page) > 0 {
		s.after = page[len(page)-1].Digest
	}
	return 0
}

// ended records, at the end of a full listing that supplied every entry,
// that the kernel has fresh attributes for all of them.
func (s *nsStream) ended() {
	if s.full && s.supplied >= s.produced {
		s.d.refreshedAt.Store(s.start.UnixNano())
	}
}

// Lookup serves READDIRPLUS for the entry just produced.
func (s *nsStream) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	s.mu.Lock()
	last, lastN, full := s.last, s.lastN, s.full
	info, stated := s.infos[last.Digest]
	s.mu.Unlock()
	var ch *fs.Inode
	var errno syscall.Errno
	switch {
	case lastN == "" || name != lastN:
		ch, errno = s.d.Lookup(ctx, name, out)
	case stated:
		// Unknown when its page was fetched (and so in infos).
		ch = s.d.newBlobChild(ctx, name, last, info, out)
	case !full && s.d.knownBlob(name) != nil:
		s.d.fsys.stats.entriesLeftOut.Add(1)
		return nil, errLeaveOut
	default:
		ch, errno = s.d.blobChild(ctx, name, last, nil, out)
	}
	if errno == 0 {
		s.mu.Lock()
		s.supplied++
		s.mu.Unlock()
	}
	return ch, errno
}

// Seekdir supports rewinddir and telldir/seekdir: offsets are entry
// ordinals, so a seek re-lists from the start and skips (rare; O(off)).
func (s *nsStream) Seekdir(ctx context.Context, off uint64) syscall.Errno {
	s.mu.Lock()
	defer s.mu.Unlock()
	return seekOrdinal(s.off, off, func() {
		s.off, s.page, s.names, s.i, s.after, s.eof, s.last, s.lastN = 0, s.page[:0], s.names[:0], 0, blob.Digest{}, false, namespaces.Ref{}, ""
		s.produced, s.supplied = 0, 0
	}, s.next)
}

// seekOrdinal moves a listing whose offsets are entry ordinals from cur to
// off: it resets the listing and produces entries until off (O(off); only
// telldir/seekdir and rewinddir need it).
func seekOrdinal(cur, off uint64, reset func(), next func() (*fuse.DirEntry, syscall.Errno)) syscall.Errno {
	if off == cur {
		return 0
	}
	reset()
	for n := uint64(0); n < off; n++ {
		de, errno := next()
		if errno != 0 {
			return errno
		}
		if de == nil {
			break
		}
	}
	return 0
}

func (s *nsStream) Releasedir(ctx context.Context, releaseFlags uint32) {}
