package fusefs

// The publish state machine of a file in incoming/ (and of a verified put
// by path): what FLUSH, RELEASE, a write, a truncate by path, an unlink and
// an expiry do, as a pure function of the file's state. fileNode keeps the
// state and carries out the steps (filenode.go, filehandle.go); this file
// only decides. The rules it keeps, and why, are docs/publish.md; this is
// them as a table (TestDecide has a row per line, and more):
//
//	event     state (and facts of the event)                       steps
//	FLUSH     written since create/truncate; no other writer busy  commit+intent, owe
//	FLUSH     another writer has unflushed writes (othersBusy)     - (the last of them commits)
//	FLUSH     nothing written since create/truncate                owe (`cmd > f`: nothing committed)
//	FLUSH     committed already, nothing new (a fork's close)      -
//	FLUSH     failed                                               fail (the close reports it)
//	FLUSH     put by path, wrote through this descriptor           commit+link
//	FLUSH     put by path, empty, named e3b0…                      commit+link
//	FLUSH     put by path, empty, another name                     refuse (EIO)
//	FSYNC     dirty, othersBusy or not                             commit+intent, owe; the caller syncs
//	FSYNC     put by path                                          commit+link (incomplete: EIO)
//	RELEASE   last writer, intent pending                          settle, pay
//	RELEASE   last writer, written since the last commit           commit+link, pay
//	RELEASE   last writer, re-opened and unchanged                 discard (and settle an intent)
//	RELEASE   last writer, failed                                  settle an intent; at the last handle, gone
//	RELEASE   a writer remains                                     -
//	WRITE     receipt, or intent pending with no upload            reopen (seeded with the content)
//	TRUNCATE  by path, nobody writing, changed                     commit+link
//	UNLINK    a writer open                                        detach (its last RELEASE links)
//	UNLINK    no writer open, upload in flight                     detach, discard
//	EXPIRE    in use / idle / detached                             rearm / detach / -
//
// A decision never links an incoming file's version at a FLUSH
// (TestDecideNeverLinksEarly): only a put by path links there, its name
// being its digest. "owe" is why a close is visible through this mount as
// soon as it returns: the kernel sends the RELEASE just after the last
// close, so a lookup of the digest (or a listing of the namespace) waits
// for a RELEASE owed by a close of the last 200 ms (incTree.owe).

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
				// What failed came after the pending version, whose
				// close returned 0: that version is published, the
				// failed one never.
				p = stepSettle
			case s.uploading && s.dirty:
				p = stepCommitLink
			case s.uploading:
				p = stepDiscard | stepSettle // re-opened, nothing changed
			default:
				p = stepSettle
			}
			if !s.pending {
				p &^= stepSettle
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
