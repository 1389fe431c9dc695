package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"runtime"
	"sync"
	"time"

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

The exit status is 1 if any blob is bad, 0 if all are intact. Memory stays
bounded whatever the size of the store or of a blob: blobs stream through
--jobs readers of 1 MiB buffers. With --jobs above 1 the bad lines come in
the order found, not sorted.

verify repairs nothing. A re-put of content already present writes nothing,
so to restore a corrupt blob, first unlink it from its namespaces and delete
it (alkblobfs rm DIGEST), then put the good content again with --ns.

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
			ds := make([]store.Digest, len(args))
			for i, s := range args {
				d, err := parseDigest(cmd, s)
				if err != nil {
					return err
				}
				ds[i] = d
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
			var seq iter.Seq2[store.Digest, error]
			if len(ds) > 0 {
				seq = digestsOf(ds)
			} else {
				seq = poolDigests(cmd.Context(), st)
			}
			sum, err := scrub(cmd.Context(), st, seq, len(ds) > 0, jobs, out)
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

// Blob verdicts of a scrub.
const (
	verdictOK         = ""
	verdictCorrupt    = "corrupt"
	verdictUnreadable = "unreadable"
	verdictMissing    = "missing"
	verdictCancelled  = "cancelled" // not read: the scrub is stopping
)

// scrubResult is the verdict on one blob.
type scrubResult struct {
	Digest store.Digest `json:"digest"`
	Tier   store.Tier   `json:"tier,omitempty"`
	Status string       `json:"status"`
	Error  string       `json:"error,omitempty"`
	size   int64
}

// scrubSummary counts a scrub.
type scrubSummary struct {
	Checked    int64         `json:"checked"` // blobs read (intact or not)
	Bytes      int64         `json:"bytes"`   // bytes of the intact ones
	Corrupt    int64         `json:"corrupt"`
	Unreadable int64         `json:"unreadable"`
	Missing    int64         `json:"missing"`
	Duration   time.Duration `json:"duration_ns"`
	Error      string        `json:"error,omitempty"` // why the scrub stopped early
}

// scrub verifies the blobs of seq with jobs workers and reports each bad
// one to out as it is found. explicit says the digests were named by the
// user: one the store lacks is then MISSING, whereas a listed blob that
// vanished before it was read (a concurrent sweep) is skipped. The error is
// for failures of the scrub itself (listing, cancellation), not for bad
// blobs.
func scrub(ctx context.Context, st *store.Store, seq iter.Seq2[store.Digest, error], explicit bool, jobs int, out scrubOutput) (scrubSummary, error) {
	start := time.Now()
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan store.Digest, jobs)
	results := make(chan scrubResult, jobs)
	var listErr error
	go func() {
		defer close(work)
		for d, err := range seq {
			if err != nil {
				listErr = err
				return
			}
			select {
			case work <- d:
			case <-ctx.Done():
				return
			}
		}
	}()
	var wg sync.WaitGroup
	for range jobs {
		wg.Go(func() {
			for d := range work {
				results <- verifyBlob(ctx, st, d)
			}
		})
	}
	go func() { wg.Wait(); close(results) }()

	var sum scrubSummary
	var outErr error
	for r := range results {
		switch r.Status {
		case verdictCancelled:
			continue
		case verdictOK:
			sum.Checked++
			sum.Bytes += r.size
			continue
		case verdictCorrupt:
			sum.Checked++
			sum.Corrupt++
		case verdictUnreadable:
			sum.Checked++
			sum.Unreadable++
		case verdictMissing:
			if !explicit {
				continue
			}
			sum.Missing++
		}
		if outErr == nil {
			if outErr = out.bad(r); outErr != nil {
				cancel() // stdout is gone (a closed pipe): stop reading blobs
			}
		}
	}
	sum.Duration = time.Since(start)
	// results is closed, so the lister has returned: listErr is settled.
	if err := errors.Join(listErr, outErr); err != nil {
		return sum, err
	}
	return sum, parent.Err() // interrupted: the counts are partial
}

// verifyBlob reads d to EOF through the verifying reader.
func verifyBlob(ctx context.Context, st *store.Store, d store.Digest) scrubResult {
	res := scrubResult{Digest: d}
	if ctx.Err() != nil {
		res.Status = verdictCancelled
		return res
	}
	r, ok, err := st.Get(ctx, d)
	switch {
	case err != nil:
		// Get verifies kv blobs as it opens them, so a corrupt kv blob
		// fails here; find its tier from metadata.
		if info, ok, serr := st.Stat(ctx, d); serr == nil && ok {
			res.Tier = info.Tier
		}
		return verdict(res, err)
	case !ok:
		res.Status = verdictMissing
		return res
	}
	defer r.Close()
	res.Tier = r.Tier()
	res.size = r.Len()
	// A transfer stops the copy when ctx ends: the reader does not watch it.
	t := newTransfer(ctx, nil, false, r.Len(), "")
	_, err = r.WriteTo(t.writer(io.Discard))
	return verdict(res, err)
}

// verdict classifies a read error: content that does not hash to its
// digest, or that ends early, is corrupt; any other failure is reported as
// unreadable (the bytes may be fine; the medium failed to deliver them).
func verdict(res scrubResult, err error) scrubResult {
	switch {
	case err == nil:
		res.Status = verdictOK
	case errors.Is(err, store.ErrMissing):
		res.Status = verdictMissing // deleted since it was listed
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		res.Status = verdictCancelled
	case errors.Is(err, store.ErrVerification), errors.Is(err, io.ErrUnexpectedEOF):
		res.Status, res.Error = verdictCorrupt, err.Error()
	default:
		res.Status, res.Error = verdictUnreadable, err.Error()
	}
	return res
}

func digestsOf(ds []store.Digest) iter.Seq2[store.Digest, error] {
	return func(yield func(store.Digest, error) bool) {
		for _, d := range ds {
			if !yield(d, nil) {
				return
			}
		}
	}
}

func poolDigests(ctx context.Context, st *store.Store) iter.Seq2[store.Digest, error] {
	return func(yield func(store.Digest, error) bool) {
		for e, err := range st.List(ctx) {
			if !yield(e.Digest, err) || err != nil {
				return
			}
		}
	}
}

// scrubOutput prints a scrub as it goes.
type scrubOutput interface {
	bad(r scrubResult) error
	finish(s scrubSummary, err error) error
}

type textScrub struct{ w io.Writer }

func (o *textScrub) bad(r scrubResult) error {
	var err error
	switch r.Status {
	case verdictMissing:
		_, err = fmt.Fprintf(o.w, "MISSING %s\n", r.Digest)
	case verdictCorrupt:
		_, err = fmt.Fprintf(o.w, "CORRUPT %s %s: %s\n", r.Digest, tierOrUnknown(r.Tier), r.Error)
	default:
		_, err = fmt.Fprintf(o.w, "UNREADABLE %s %s: %s\n", r.Digest, tierOrUnknown(r.Tier), r.Error)
	}
	return err
}

func (o *textScrub) finish(s scrubSummary, err error) error {
	verdict := "all intact"
	if bad := s.Corrupt + s.Unreadable + s.Missing; bad > 0 {
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

func (o *jsonScrub) bad(r scrubResult) error {
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

func (o *jsonScrub) finish(s scrubSummary, err error) error {
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
