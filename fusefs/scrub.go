package fusefs

import (
	"github.com/alkblobfs/alkblobfs/store"
)

// judgeScrub is the mount's part of a scrub (upkeep.Scrubber runs it, on
// --scrub-every's timer and when an operator writes "run" to
// .alkblobfs/scrub): it counts and logs a corrupt blob. The store itself
// records the verdict, so from then on the blob is EIO at open here — and
// refused by every other process that opens the store — until it is
// repaired (store: verdicts.go).
func (f *FS) judgeScrub(r store.ScrubResult) {
	if r.Status == store.ScrubCorrupt {
		f.stats.verifyFailures.Add(1)
		f.log.Error("scrub: blob is corrupt; refusing to serve it", "digest", r.Digest.String(), "tier", string(r.Tier), "err", r.Error)
	}
}
