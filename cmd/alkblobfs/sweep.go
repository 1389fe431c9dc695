package main

import (
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/gc"
)

func newSweepCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:         "sweep",
		Annotations: writes,
		Short:       "Run one garbage-collection sweep and print its report",
		Long: `sweep deletes the blobs that nothing keeps alive and prints what it did.
A blob is alive while a namespace links it (see "alkblobfs ns"); a blob put
without --ns and never linked is not, and goes.

Blobs found dead are staged in the delete window (--gc-window) and deleted
once it has passed. With the SQLite kv engine the window is durable: a sweep
deletes what an earlier sweep staged, so a dead blob goes at the second sweep
after it died (run sweep twice to collect at once with --gc-window 0). Otherwise
this sweep waits the window out and deletes them itself. Every candidate is
checked again just before its delete, so a blob linked in the meantime stays.

One sweep runs at a time per store: a sweep started while another runs, in
any process (a mount's timer or control file, another sweep command), reports
SweeperLock and deletes nothing. Blobs that any process holds open or is
putting are never deleted, whichever process sweeps.

A sweep that deliberately does nothing is a result, not a failure: it exits 0
with the reason in "aborted". NoLivenessSources means no liveness source is
registered, so nothing can be proven dead: the case for stores that keep no
namespaces (--kv none, or a mem: kv tier beside a durable large tier). The
exit status is non-zero only when the sweep itself failed.`,
		Example: `  alkblobfs sweep && alkblobfs sweep     # stage, then delete (SQLite)
  alkblobfs --gc-window 10m sweep --json`,
		Args: argsRange(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := a.open(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			// Another process sweeping the same pool (a mount, another
			// sweep) holds the pool's sweep lease: a SweeperLock report.
			rep, err := st.Sweep(cmd.Context())
			if err != nil {
				return fmt.Errorf("sweep: %w", err)
			}
			if asJSON {
				b, err := json.MarshalIndent(rep, "", "  ")
				if err != nil {
					return err
				}
				fmt.Fprintf(a.stdout, "%s\n", b)
			} else {
				printReport(a.stdout, rep)
			}
			return st.Close()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the report as JSON")
	return cmd
}

// abortMeaning explains each abort cause to an operator.
var abortMeaning = map[gc.AbortCause]string{
	gc.AbortNoLivenessSources: "no liveness source is registered, so nothing can be proven dead",
	gc.AbortSweeperLock:       "another sweep is running",
	gc.AbortProtectFailed:     "the protect callback failed",
}

func printReport(w io.Writer, r gc.Report) {
	if r.Aborted != "" {
		fmt.Fprintf(w, "sweep aborted: %s: %s; nothing deleted\n", r.Aborted, abortMeaning[r.Aborted])
		if r.Detail != "" {
			fmt.Fprintf(w, "detail     %s\n", r.Detail)
		}
		return
	}
	window := "in-process"
	if r.Durable {
		window = "durable"
	}
	fmt.Fprintf(w, "scanned    %d blobs, %d live\n", r.Scanned, r.Live)
	fmt.Fprintf(w, "queued     %d candidates\n", r.Queued)
	fmt.Fprintf(w, "deleted    %d (%s freed)\n", r.Deleted, humanSize(r.BytesFreed))
	fmt.Fprintf(w, "cancelled  %d by arbitration\n", r.Cancelled)
	fmt.Fprintf(w, "pending    %d in the %s window (delay %s)\n", r.Pending, window, r.Delay)
	fmt.Fprintf(w, "duration   %s\n", roundDuration(r.Duration))
}

// roundDuration keeps about three significant digits.
func roundDuration(d time.Duration) time.Duration {
	if d >= time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(time.Microsecond)
}
