package main

import (
	"encoding/json"
	"fmt"
	"io"
	"runtime"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/store"
)

func newVerifyCmd(a *app) *cobra.Command {
	var asJSON bool
	var jobs int
	cmd := &cobra.Command{
		Use:   "verify [DIGEST...]",
		Short: "Check that stored blobs still hash to their digests",
		Long: `verify (a scrub) reads every blob in the store, or each DIGEST given, through
the verifying reader and checks that its content still hashes to its digest.
It prints one line per bad blob as it finds it, then a summary:

  CORRUPT <digest> <tier>: <error>      content does not match (or is truncated)
  UNREADABLE <digest> <tier>: <error>   the engine failed to read it
  MISSING <digest>                      a DIGEST given is not in the store
  MISSING <digest>: lost: …             a namespace links it, no tier holds it

The exit status is 1 if any blob is bad, 0 if all are intact. Memory stays
bounded whatever the size of the store or of a blob: blobs stream through
--jobs readers of 1 MiB buffers. With --jobs above 1 the bad lines come in
the order found, not sorted.

verify repairs nothing, but the store remembers what it finds: a corrupt
blob is refused from then on by every process that opens the store (a
mount: EIO; HTTP: 500; get and cat: an error, nothing written), until it is
repaired. To repair one, put the good content again (alkblobfs put FILE):
that replaces the corrupt copy, where a put of content already present
otherwise writes nothing. A blob whose file was restored since is served
verified only, until a whole read or another verify finds it intact.

With --json it prints one JSON document instead: {"bad":[{"digest","tier",
"status","error"}...], "checked", "bytes", "corrupt", "unreadable",
"missing", "duration_ns"}; "bad" is streamed as found.`,
		Example: `  alkblobfs verify
  alkblobfs verify 3f0a…e91c 9b1d…07aa
  alkblobfs verify --json --jobs 8 | jq '.bad[].digest'`,
		Args: argsRange(0, -1, "DIGESTs or nothing"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if jobs < 1 {
				return usagef(cmd, "--jobs %d: want at least 1", jobs)
			}
			ds, err := parseDigests(cmd, args)
			if err != nil {
				return err
			}
			st, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			var out scrubOutput = &textScrub{w: a.stdout}
			if asJSON {
				out = &jsonScrub{w: a.stdout}
			}
			seq := st.Digests(cmd.Context())
			if len(ds) > 0 {
				seq = store.Digests(ds...)
			}
			sum, err := st.Scrub(cmd.Context(), seq, store.ScrubOptions{
				Jobs:     jobs,
				Explicit: len(ds) > 0,
				Result: func(r store.ScrubResult) error {
					if r.Status == store.ScrubOK {
						return nil
					}
					return out.bad(r) // an error (stdout gone) stops the scrub
				},
			})
			if ferr := out.finish(sum, err); err == nil {
				err = ferr
			}
			if err != nil {
				return fmt.Errorf("verify: %w", err)
			}
			if bad := sum.Corrupt + sum.Unreadable + sum.Missing; bad > 0 {
				return fmt.Errorf("verify: %d of %d blob%s bad (%d corrupt, %d unreadable, %d missing)",
					bad, sum.Checked+sum.Missing, plural(int(sum.Checked+sum.Missing)), sum.Corrupt, sum.Unreadable, sum.Missing)
			}
			return st.Close()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the bad blobs and the summary as one JSON document")
	cmd.Flags().IntVarP(&jobs, "jobs", "j", min(4, runtime.GOMAXPROCS(0)), "blobs verified in parallel")
	return cmd
}

// scrubOutput prints a scrub as it goes.
type scrubOutput interface {
	bad(r store.ScrubResult) error
	finish(s store.ScrubSummary, err error) error
}

type textScrub struct{ w io.Writer }

func (o *textScrub) bad(r store.ScrubResult) error {
	var err error
	switch r.Status {
	case store.ScrubMissing:
		if r.Lost {
			_, err = fmt.Fprintf(o.w, "MISSING %s: lost: a namespace links it but no tier holds its content\n", r.Digest)
		} else {
			_, err = fmt.Fprintf(o.w, "MISSING %s\n", r.Digest)
		}
	case store.ScrubCorrupt:
		_, err = fmt.Fprintf(o.w, "CORRUPT %s %s: %s\n", r.Digest, tierOrUnknown(r.Tier), r.Error)
	default:
		_, err = fmt.Fprintf(o.w, "UNREADABLE %s %s: %s\n", r.Digest, tierOrUnknown(r.Tier), r.Error)
	}
	return err
}

func (o *textScrub) finish(s store.ScrubSummary, err error) error {
	verdict := "all intact"
	if s.Bad() > 0 {
		verdict = fmt.Sprintf("%d corrupt, %d unreadable, %d missing", s.Corrupt, s.Unreadable, s.Missing)
	}
	if err != nil {
		verdict += "; stopped early"
	}
	_, werr := fmt.Fprintf(o.w, "verified %d blob%s (%s) in %s: %s\n", s.Checked, plural(int(s.Checked)), humanSize(s.Bytes), roundDuration(s.Duration), verdict)
	return werr
}

func tierOrUnknown(t store.Tier) store.Tier {
	if t == "" {
		return "?"
	}
	return t
}

// jsonScrub streams one JSON document: the "bad" array is written element
// by element as blobs are found, so memory does not grow with their number.
type jsonScrub struct {
	w       io.Writer
	started bool
	n       int
}

func (o *jsonScrub) open() error {
	if o.started {
		return nil
	}
	o.started = true
	_, err := io.WriteString(o.w, `{"bad":[`)
	return err
}

func (o *jsonScrub) bad(r store.ScrubResult) error {
	if err := o.open(); err != nil {
		return err
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	sep := "\n"
	if o.n > 0 {
		sep = ",\n"
	}
	o.n++
	_, err = fmt.Fprintf(o.w, "%s%s", sep, b)
	return err
}

func (o *jsonScrub) finish(s store.ScrubSummary, err error) error {
	if err != nil {
		s.Error = err.Error()
	}
	if err := o.open(); err != nil {
		return err
	}
	b, jerr := json.Marshal(s)
	if jerr != nil {
		return jerr
	}
	// b is {"checked":…}: splice its fields after the array.
	_, werr := fmt.Fprintf(o.w, "],\n%s\n", b[1:])
	return werr
}
