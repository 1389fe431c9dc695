package fusefs

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// halfVersionScenarios write part A, let some descriptor of the file be
// closed while the writer goes on, then write part B and close. $F is the
// incoming file, $AF and $BF files holding the parts, $A and $B shell
// variables holding them (printf writes with no process of its own).
var halfVersionScenarios = []struct{ name, script string }{
	{"fork, the child closes its descriptor",
		`exec 3>"$F"; printf '%s' "$A" >&3; ( exec 3>&-; sleep 0.05 ); pause; printf '%s' "$B" >&3; exec 3>&-`},
	{"fork, the child exits",
		`exec 3>"$F"; printf '%s' "$A" >&3; ( sleep 0.05 ); pause; printf '%s' "$B" >&3; exec 3>&-`},
	{"dup, the copy is closed",
		`exec 3>"$F"; printf '%s' "$A" >&3; exec 4>&3; exec 4>&-; pause; printf '%s' "$B" >&3; exec 3>&-`},
	{"( echo a; cat b ) > f",
		`( printf '%s' "$A"; pause; cat "$BF" ) > "$F"`},
	{"{ cat a; cat b; } > f",
		`{ cat "$AF"; pause; cat "$BF"; } > "$F"`},
	{"exec 3>f, writes from subshells",
		`exec 3>"$F"; ( printf '%s' "$A" >&3 ); pause; ( printf '%s' "$B" >&3 ); exec 3>&-`},
	{"two opens, the first closed while the second is open",
		`exec 3>"$F" 4>>"$F"; printf '%s' "$A" >&3; exec 3>&-; pause; printf '%s' "$B" >&4; exec 4>&-`},
}

// pauseFunc is the scenarios' pause between a writer's two halves: it
// waits, with a bound, until the poller has looked pollsInPause times
// (the poller answers $PAUSED with $RESUME), so that the half-written
// file is polled on a machine of any speed.
const pauseFunc = `pause() { : > "$PAUSED"; for ((n = 0; n < 6000; n++)); do if [ -e "$RESUME" ]; then rm -f "$RESUME"; return; fi; sleep 0.01; done; echo "pause: the poller did not poll in 60 s" >&2; exit 1; }; `

const pollsInPause = 5

// TestNoIntermediateVersion: while a writer runs, a poller listing the
// namespace and looking up the intermediate digest never sees any version
// but the final one, on both tiers; the intermediate version is not linked
// afterwards either.
func TestNoIntermediateVersion(t *testing.T) {
	for _, tc := range []struct {
		spec storeSpec
		size int
	}{{defaultSpec, 100}, {defaultSpec, 200 << 10}, {memSpec, 100}, {pgSpec, 100}} {
		t.Run(fmt.Sprintf("%s/%dB", tc.spec.name, tc.size), func(t *testing.T) {
			e := mountStore(t, tc.spec)
			ns := e.mkns("ns")
			dir := t.TempDir()
			allowed := map[string]bool{incomingName: true} // earlier scenarios' final versions
			for i, sc := range halfVersionScenarios {
				a := textBytes(uint64(2*i+1), tc.size)
				b := textBytes(uint64(2*i+2), tc.size)
				af, bf := filepath.Join(dir, fmt.Sprint(i, "a")), filepath.Join(dir, fmt.Sprint(i, "b"))
				writeFile(t, af, a)
				writeFile(t, bf, b)
				final := sum(append(slices.Clone(a), b...))
				half := sum(a)
				stop := make(chan struct{})
				sig := t.TempDir()
				paused, resume := filepath.Join(sig, "paused"), filepath.Join(sig, "resume")
				var polls atomic.Int64
				var seen sync.Map
				var wg sync.WaitGroup
				wg.Go(func() {
					pausedAt := int64(-1)
					for {
						select {
						case <-stop:
							return
						default:
						}
						ents, _ := os.ReadDir(ns)
						for _, de := range ents {
							if !allowed[de.Name()] && de.Name() != final {
								seen.Store(de.Name(), "listed")
							}
						}
						if _, err := os.Lstat(filepath.Join(ns, half)); err == nil {
							seen.Store(half, "looked up")
						}
						polls.Add(1)
						// The writer pauses between its two halves until
						// this poller has looked pollsInPause times.
						if _, err := os.Stat(paused); err == nil {
							if pausedAt < 0 {
								pausedAt = polls.Load()
							} else if polls.Load()-pausedAt >= pollsInPause {
								os.Remove(paused)
								os.WriteFile(resume, nil, 0o644)
								pausedAt = -1
							}
						}
					}
				})
				cmd := exec.Command("bash", "-c", pauseFunc+`A=$(<"$AF"); B=$(<"$BF"); `+sc.script)
				cmd.Env = append(os.Environ(), "F="+filepath.Join(ns, incomingName, fmt.Sprint("f", i)), "AF="+af, "BF="+bf,
					"PAUSED="+paused, "RESUME="+resume)
				out, err := cmd.CombinedOutput()
				close(stop)
				wg.Wait()
				if err != nil {
					t.Fatalf("%s: %v\n%s", sc.name, err, out)
				}
				seen.Range(func(k, v any) bool {
					t.Errorf("%s: the poller saw %s (%v); only %s may show", sc.name, k.(string)[:12], v, final[:12])
					return true
				})
				// A poll may wait up to releaseWait for the RELEASE that a
				// forked child's or a dup's close seems to owe; the writer's
				// pause lasts pollsInPause polls, however slow they are.
				if polls.Load() < pollsInPause {
					t.Errorf("%s: only %d polls while the writer ran", sc.name, polls.Load())
				}
				// The final version shows once the close returned; it and
				// the earlier scenarios' are all the namespace holds.
				listed := e.listNS(t, "ns")
				if !slices.Contains(listed, final) || slices.Contains(listed, half) || len(listed) != i+1 {
					t.Fatalf("%s: the namespace lists %v; want the final %s and nothing half-written", sc.name, short(listed), final[:12])
				}
				if got := fileSum(t, filepath.Join(ns, final)); got != final {
					t.Fatalf("%s: the final version reads as %s", sc.name, got)
				}
				allowed[final] = true
			}
		})
	}
}

// textBytes is n bytes of printable text (a shell variable can hold it).
func textBytes(seed uint64, n int) []byte {
	b := randBytes(seed, n)
	for i := range b {
		b[i] = 'a' + b[i]%26
	}
	return bytes.Clone(b)
}

// TestCloseThenStat: what `cp f incoming/ && stat ns/<digest>` relies on —
// the file is visible through the mount as soon as the close returns, with
// no retry, on every store.
func TestCloseThenStat(t *testing.T) {
	for _, spec := range storeSpecs {
		t.Run(spec.name, func(t *testing.T) {
			e := mountStore(t, spec)
			ns := e.mkns("ns")
			for i := range 200 {
				b := []byte(fmt.Sprint("file ", i, time.Now().UnixNano()))
				if err := os.WriteFile(filepath.Join(ns, incomingName, fmt.Sprint(i)), b, 0o644); err != nil {
					t.Fatal(err)
				}
				if _, err := os.Stat(filepath.Join(ns, sum(b))); err != nil {
					t.Fatalf("file %d: stat right after its close: %v", i, err)
				}
			}
			// Empty files publish at their RELEASE too.
			if err := os.WriteFile(filepath.Join(ns, incomingName, "empty"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(filepath.Join(ns, sum(nil))); err != nil {
				t.Fatalf("an empty file right after its close: %v", err)
			}
		})
	}
}

// TestCloseThenRm: `cp f incoming/ && rm incoming/f` publishes f, even
// when the unlink reaches the daemon before the close's RELEASE does.
func TestCloseThenRm(t *testing.T) {
	e := mountStore(t, defaultSpec)
	ns := e.mkns("ns")
	var want []string
	for i := range 50 {
		b := []byte(fmt.Sprint("rm after close ", i))
		name := filepath.Join(ns, incomingName, fmt.Sprint(i))
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Remove(name); err != nil {
			t.Fatal(err)
		}
		want = append(want, sum(b))
	}
	e.expectNS(t, "ns", want)
}
