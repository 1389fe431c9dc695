package fusefs

import (
	"github.com/alkblobfs/alkblobfs/store"
)

// judgeScrub is the mount's part of a scrub (upkeep.Scrubber runs it, on
// --scrub-every's timer and when an operator writes "run" to
// .alkblobfs/scrub): a local blob found corrupt is recorded in the mount's
// verdicts, and from then on it is EIO at open, and never passes through,
// until its file changes or a scrub finds it good again.
func (f *FS) judgeScrub(r store.ScrubResult) {
	switch r.Status {
	case store.ScrubOK:
		if r.File != nil {
			f.verdicts.recordGood(r.Digest, *r.File)
		}
	case store.ScrubCorrupt:
		f.stats.verifyFailures.Add(1)
		if r.File != nil {
			f.verdicts.recordCorrupt(r.Digest, *r.File)
		}
		f.log.Error("scrub: blob is corrupt; refusing to serve it", "digest", r.Digest.String(), "tier", string(r.Tier), "err", r.Error)
	}
}
