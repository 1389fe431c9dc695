// Package fusetest holds what the mount's tests share across packages:
// the FUSE availability gate, a concurrency-safe log buffer, and polling.
package fusetest

import (
	"bytes"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// RequireFUSE skips t when this machine cannot mount FUSE (no /dev/fuse,
// or not root and no fusermount3), or fails it when ALKBLOBFS_REQUIRE_FUSE=1
// (make test): CI must not go green by skipping the mount.
func RequireFUSE(t testing.TB) {
	t.Helper()
	why := ""
	if _, err := os.Stat("/dev/fuse"); err != nil {
		why = "no /dev/fuse"
	} else if os.Geteuid() != 0 {
		if _, err := exec.LookPath("fusermount3"); err != nil {
			why = "not root and no fusermount3"
		}
	}
	if why == "" {
		return
	}
	if os.Getenv("ALKBLOBFS_REQUIRE_FUSE") == "1" {
		t.Fatalf("FUSE required (ALKBLOBFS_REQUIRE_FUSE=1) but unavailable: %s", why)
	}
	t.Skipf("FUSE unavailable (%s); set ALKBLOBFS_REQUIRE_FUSE=1 to fail instead", why)
}

// Buffer is a bytes.Buffer safe for concurrent Write and String: a
// daemon's or a mount's log, read by the test while it is written.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// Eventually polls cond until it holds, failing t after within times
// Slack: tests wait on conditions, never on sleeps.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	within *= Slack
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Slack multiplies the bound of every wait for a condition. A bound is
// what the condition needs on a quiet machine with room to spare; the
// suite must also pass beside other builds and a CPU hog (load 10 on two
// cores), where a daemon's start or a mount's exit takes several times as
// long. A bound only decides when a test that is failing gives up, so a
// generous one costs a passing test nothing. A test of a promised
// latency measures it and compares, rather than relying on this bound.
const Slack = 3
