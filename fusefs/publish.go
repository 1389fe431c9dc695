package fusefs

// The publish state machine of a file in incoming/ (and of a verified put
// by path): what FLUSH, RELEASE, a write, a truncate by path, an unlink and
// an expiry do, as a pure function of the file's state. fileNode keeps the
// state and carries out the steps (filenode.go, filehandle.go); this file only decides.
//
// The rules, and why:
//
//   - FLUSH is close(2) of one descriptor, not "the file is finished": a
//     forked child, a dup'd copy or the first command of `{ a; b; } > f`
//     closes its descriptor while the writer goes on. So a FLUSH commits
//     the content (hash, store, and an intent to link, all durable: the
//     close reports any error and a crash after it loses nothing) but does
//     not link it. The last RELEASE (no writer descriptor left) settles
//     the newest intent into the namespace reference; every earlier one
//     was replaced unseen. No version but the final one is ever visible.
//   - A FLUSH commits only once something was written since the file was
//     created or truncated to nothing: a shell's `cmd > f` flushes before
//     cmd writes, and that empty version is never committed. A file left
//     empty (`: > f`, touch) publishes at its last RELEASE.
//   - A FLUSH commits only when every other writer descriptor has flushed
//     since its last write: two opens writing one file finish with the
//     last of them.
//   - A put by path links at its FLUSH: its name is its digest, so there
//     is no other version it could show. It commits only at a FLUSH after
//     writes through that descriptor (its early empty flush would fail).
//   - A failed write or commit ends the upload; every later close reports
//     the error, the intent is dropped, and the name goes with the last
//     descriptor.
//   - An unlink (rm, a rename over the name, mv's copy-and-unlink of a
//     rename into another namespace) takes the name, not the content: a
//     descriptor still open for writing goes on committing at its closes,
//     and the last RELEASE links the final version, as if the name were
//     still there. A close that returned 0 is never lost, and `cp f
//     incoming/ && rm incoming/f` publishes f even when the unlink reaches
//     the daemon before the kernel's RELEASE does. Only an upload nobody
//     has open for writing is dropped at the unlink (there is no close to
//     come that could report on it).
//   - An fsync commits like a FLUSH that nothing else holds back (other
//     writers' unflushed writes, an early empty flush), and makes the
//     commit durable before it returns: after a crash, or a power loss, the
//     next mount publishes the newest version that an fsync or a close
//     committed.

// fileState is what the decisions depend on.
type fileState struct {
	uploading bool // an upload is open
	dirty     bool // the upload differs from the last committed version
	written   bool // written or extended since created or truncated to nothing
	pending   bool // a committed version awaits the last RELEASE (an intent)
	owing     bool // lookups wait for this file's RELEASE (see incTree.owe)
	failed    bool // a write or commit failed
	detached  bool // unlinked, renamed over or expired
	byPath    bool // a verified put by path
}

type eventKind uint8

const (
	evFlush        eventKind = iota // close(2) of a descriptor
	evRelease                       // the kernel dropped one open
	evWrite                         // a write or ftruncate through a descriptor
	evTruncatePath                  // truncate(2) with no descriptor open for writing
	evUnlink                        // unlink, or a rename over the name
	evExpire                        // the receipt's TTL ran out
	evFsync                         // fsync(2) or fdatasync(2) of a descriptor
)

// event is one request and the facts about the file's other descriptors
// that it needs.
type event struct {
	kind eventKind
	// evFlush: the flushing descriptor is open for writing, and wrote
	// since its previous flush.
	writer, wrote bool
	// evFlush: another writer descriptor has writes it has not flushed.
	othersBusy bool
	// evFlush of a put by path: the upload is empty and the empty content
	// does not hash to the name.
	emptyMismatch bool
	// evRelease: no writer descriptor remains, and no descriptor at all.
	lastWriter, lastHandle bool
	// evUnlink: no writer descriptor is open. evExpire: descriptors are
	// open or an upload is in flight.
	noWriters, inUse bool
}

// step is one effect a decision asks for; a decision is a set of them.
type step uint16

const (
	stepFail         step = 1 << iota // report the file's failure (close, write)
	stepReopen                        // start an upload seeded with the committed content
	stepCommitIntent                  // commit the upload and record an intent replacing any earlier one
	stepCommitLink                    // commit the upload and link it now; drop any intent
	stepSettle                        // link the intent's version
	stepCancel                        // drop the intent
	stepDiscard                       // drop the upload unpublished
	stepOwe                           // lookups wait for this file's RELEASE
	stepPay                           // stop waiting for it
	stepDetach                        // take the name out of the tree
	stepGone                          // a failed file's last descriptor: remove its name
	stepRearm                         // look again a TTL later
	stepRefuse                        // this close fails (EIO): the file is empty, not the content its name claims
)

// has reports whether the set p includes any of s.
func (p step) has(s step) bool { return p&s != 0 }

// decide returns what event e does to a file in state s.
func decide(s fileState, e event) step {
	var p step
	switch e.kind {
	case evFlush:
		switch {
		case s.failed:
			p = stepFail
		case !s.uploading || !s.dirty || e.othersBusy:
		case !s.written:
			switch {
			case s.byPath && e.writer && e.emptyMismatch:
				// Nothing written, and the empty content does not hash
				// to the name: the close of open(O_CREAT) alone, or of
				// touch, reports it. The put stays open: a shell's `cmd
				// > <digest>` closes its first descriptor before cmd
				// writes through the dup'd one.
				p = stepRefuse
			case s.byPath && e.writer:
				// The empty digest's own name: the content is right as it
				// is, and shows once the close returns.
				p = stepCommitLink
			case e.writer && !s.byPath && !s.owing:
				// Empty so far: nothing to commit. An empty incoming
				// file publishes at its last RELEASE; until then
				// lookups wait.
				p = stepOwe
			}
		case s.byPath:
			if e.wrote {
				p = stepCommitLink
			}
		default:
			p = stepCommitIntent | stepOwe
		}
	case evFsync:
		switch {
		case s.failed:
			p = stepFail
		case !s.uploading || !s.dirty:
			// Committed already: the caller still syncs the store.
		case s.byPath:
			// Its name is its digest: what is durable must be complete.
			p = stepCommitLink
		default:
			p = stepCommitIntent | stepOwe
		}
	case evRelease:
		if e.lastWriter {
			switch {
			case s.failed:
				p = stepCancel
			case s.uploading && s.dirty:
				p = stepCommitLink
			case s.uploading:
				p = stepDiscard | stepSettle // re-opened, nothing changed
			default:
				p = stepSettle
			}
			if !s.pending {
				p &^= stepSettle | stepCancel
			}
			if !s.uploading {
				p &^= stepDiscard
			}
		}
		if s.owing && e.lastWriter {
			p |= stepPay
		}
		if s.failed && e.lastHandle && !s.detached {
			p |= stepGone
		}
	case evWrite:
		switch {
		case s.failed:
			p = stepFail
		case !s.uploading:
			p = stepReopen
		}
	case evTruncatePath:
		// After the truncation (decided as evWrite): nobody has the file
		// open for writing, so a change is complete.
		if s.uploading && s.dirty && !s.failed && !s.detached {
			p = stepCommitLink
		}
	case evUnlink:
		p = stepDetach
		if s.uploading && e.noWriters {
			p |= stepDiscard
		}
	case evExpire:
		switch {
		case s.detached:
		case e.inUse:
			p = stepRearm
		default:
			p = stepDetach
		}
	}
	return p
}
