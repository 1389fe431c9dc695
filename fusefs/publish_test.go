package fusefs

import (
	"fmt"
	"strings"
	"testing"
)

func (p step) String() string {
	names := []string{"fail", "reopen", "commit-intent", "commit-link", "settle",
		"discard", "owe", "pay", "detach", "gone", "rearm", "refuse"}
	var out []string
	for i, n := range names {
		if p.has(1 << i) {
			out = append(out, n)
		}
	}
	if len(out) == 0 {
		return "-"
	}
	return strings.Join(out, "+")
}

// TestDecide is the publish state machine's table: per state, what each
// event does.
func TestDecide(t *testing.T) {
	var (
		// An upload with content written since creation.
		writing = fileState{uploading: true, dirty: true, written: true}
		// Created or truncated, nothing written yet.
		empty = fileState{uploading: true, dirty: true}
		// Committed at a close, a descriptor still open.
		pending = fileState{pending: true, owing: true}
		// Written again after that close, through a descriptor still open.
		pendingWriting = fileState{uploading: true, dirty: true, written: true, pending: true, owing: true}
		// Re-opened for writing, nothing changed.
		reopened = fileState{uploading: true, written: true}
		// A receipt at rest.
		published = fileState{}
		failed    = fileState{failed: true}
		byPath    = fileState{uploading: true, dirty: true, written: true, byPath: true}
	)
	with := func(s fileState, f func(*fileState)) fileState { f(&s); return s }
	flush := event{kind: evFlush, writer: true, wrote: true}
	last := event{kind: evRelease, lastWriter: true, lastHandle: true}
	for _, tc := range []struct {
		name  string
		s     fileState
		e     event
		want  step
		notes string
	}{
		// FLUSH
		{"flush writing", writing, flush, stepCommitIntent | stepOwe, "commit, link later"},
		{"flush while another writer is busy", writing, event{kind: evFlush, writer: true, wrote: true, othersBusy: true}, 0, "the other finishes"},
		{"flush empty", empty, flush, stepOwe, "`cmd > f`: nothing committed"},
		{"flush empty, already owing", with(empty, func(s *fileState) { s.owing = true }), flush, 0, ""},
		{"flush empty from a reader", empty, event{kind: evFlush}, 0, ""},
		{"flush pending, nothing new", pending, flush, 0, "a forked child's close"},
		{"flush pending, written again", pendingWriting, flush, stepCommitIntent | stepOwe, "replaces the intent"},
		{"flush re-opened, unchanged", reopened, flush, 0, ""},
		{"flush failed", failed, flush, stepFail, "close reports it"},
		{"flush detached", with(writing, func(s *fileState) { s.detached = true }), flush, stepCommitIntent | stepOwe, "unlinked while open: its close returned 0"},
		{"flush by path after writes", byPath, flush, stepCommitLink, "its name is its digest"},
		{"flush by path, nothing written through it", byPath, event{kind: evFlush, writer: true}, 0, "a shell's early flush"},
		{"flush by path, empty", with(byPath, func(s *fileState) { s.written = false }), flush, stepCommitLink, "the empty digest's name: right as it is"},
		{"flush by path, empty, name is not the empty digest", with(byPath, func(s *fileState) { s.written = false }), event{kind: evFlush, writer: true, emptyMismatch: true}, stepRefuse, "close(open(O_CREAT)) fails"},
		{"flush by path, written, empty dup'd close", byPath, event{kind: evFlush, writer: true, emptyMismatch: true}, 0, "written through another descriptor"},

		// fsync
		{"fsync writing", writing, event{kind: evFsync}, stepCommitIntent | stepOwe, "durable, linked at the last RELEASE"},
		{"fsync while another writer is busy", writing, event{kind: evFsync, othersBusy: true}, stepCommitIntent | stepOwe, "fsync is of the file"},
		{"fsync empty", empty, event{kind: evFsync}, stepCommitIntent | stepOwe, "asked for: the empty version is durable"},
		{"fsync committed", pending, event{kind: evFsync}, 0, "the store is synced all the same"},
		{"fsync failed", failed, event{kind: evFsync}, stepFail, ""},
		{"fsync by path", byPath, event{kind: evFsync}, stepCommitLink, "must be complete"},
		{"fsync detached", with(writing, func(s *fileState) { s.detached = true }), event{kind: evFsync}, stepCommitIntent | stepOwe, ""},

		// RELEASE
		{"release pending, last writer", pending, last, stepSettle | stepPay, "the final version shows"},
		{"release pending, a writer remains", pending, event{kind: evRelease}, 0, "fork: the parent writes on"},
		{"release writing, last writer", pendingWriting, last, stepCommitLink | stepPay, "written after the last flush"},
		{"release empty, last writer", with(empty, func(s *fileState) { s.owing = true }), last, stepCommitLink | stepPay, "`: > f` publishes"},
		{"release re-opened unchanged, pending", with(reopened, func(s *fileState) { s.pending = true }), last, stepSettle | stepDiscard, ""},
		{"release re-opened unchanged", reopened, last, stepDiscard, "back to the receipt"},
		{"release receipt", published, last, 0, ""},
		{"release failed, pending", with(failed, func(s *fileState) { s.pending = true }), last, stepSettle | stepGone, "the version whose close returned 0, not the failed one"},
		{"release failed, a reader remains", failed, event{kind: evRelease, lastWriter: true}, 0, ""},
		{"release detached, written after a close", with(pendingWriting, func(s *fileState) { s.detached = true }), last, stepCommitLink | stepPay, "the final version, as if the name were there"},
		{"release detached after a close", with(pending, func(s *fileState) { s.detached = true }), last, stepSettle | stepPay, "cp f incoming/ && rm incoming/f"},
		{"release detached, another writer", with(pending, func(s *fileState) { s.detached = true }), event{kind: evRelease}, 0, "the last writer publishes"},

		// writes
		{"write receipt", published, event{kind: evWrite}, stepReopen, "seeded with its content"},
		{"write pending", pending, event{kind: evWrite}, stepReopen, "the intent stays until replaced"},
		{"write writing", writing, event{kind: evWrite}, 0, ""},
		{"write failed", failed, event{kind: evWrite}, stepFail, ""},
		{"truncate by path", writing, event{kind: evTruncatePath}, stepCommitLink, "nobody writes: complete"},
		{"truncate by path to the same size", reopened, event{kind: evTruncatePath}, 0, ""},
		{"truncate by path, failed", with(writing, func(s *fileState) { s.failed = true }), event{kind: evTruncatePath}, 0, ""},

		// unlink and expiry
		{"unlink writing, no writers", writing, event{kind: evUnlink, noWriters: true}, stepDetach | stepDiscard, ""},
		{"unlink writing, a writer open", writing, event{kind: evUnlink}, stepDetach, "published at its last close"},
		{"unlink receipt", published, event{kind: evUnlink, noWriters: true}, stepDetach, ""},
		{"expire receipt", published, event{kind: evExpire}, stepDetach, ""},
		{"expire in use", published, event{kind: evExpire, inUse: true}, stepRearm, ""},
		{"expire detached", with(published, func(s *fileState) { s.detached = true }), event{kind: evExpire}, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := decide(tc.s, tc.e); got != tc.want {
				t.Fatalf("decide(%+v, %+v) = %v, want %v (%s)", tc.s, tc.e, got, tc.want, tc.notes)
			}
		})
	}
}

// TestDecideNeverLinksEarly: over every state and flush, a version is
// linked at a FLUSH only for a put by path; an incoming file's versions
// are linked at the last RELEASE alone.
func TestDecideNeverLinksEarly(t *testing.T) {
	for bits := range 1 << 8 {
		s := fileState{
			uploading: bits&1 != 0, dirty: bits&2 != 0, written: bits&4 != 0, pending: bits&8 != 0,
			owing: bits&16 != 0, failed: bits&32 != 0, detached: bits&64 != 0, byPath: bits&128 != 0,
		}
		for e := range 8 {
			ev := event{kind: evFlush, writer: e&1 != 0, wrote: e&2 != 0, othersBusy: e&4 != 0}
			p := decide(s, ev)
			if p.has(stepCommitLink|stepSettle) && !s.byPath {
				t.Fatalf("%s: an incoming file links at a FLUSH: %v", fmt.Sprintf("%+v %+v", s, ev), p)
			}
			if p.has(stepCommitIntent|stepCommitLink) && (s.failed || !s.dirty) {
				t.Fatalf("%+v %+v: commits %v", s, ev, p)
			}
		}
		for e := range 4 {
			ev := event{kind: evRelease, lastWriter: e&1 != 0, lastHandle: e&2 != 0}
			p := decide(s, ev)
			if !ev.lastWriter && p.has(stepSettle|stepCommitLink|stepCommitIntent) {
				t.Fatalf("%+v %+v: links while a writer remains: %v", s, ev, p)
			}
		}
	}
}
