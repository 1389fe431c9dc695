// Package s3test gives tests a prefix of their own in the bucket of the
// throw-away S3 server scripts/s3.sh starts.
//
// Without a server (ALKBLOBFS_S3_URL empty) a test that asks for one is
// skipped with a message, unless ALKBLOBFS_REQUIRE_S3=1 — s3.sh sets it —
// turns the skip into a failure, so CI cannot go green by skipping.
package s3test

import (
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/engines/enginetest/faultctl"
)

// Environment set by scripts/s3.sh.
const (
	EnvURL       = "ALKBLOBFS_S3_URL"
	EnvRequire   = "ALKBLOBFS_REQUIRE_S3"
	EnvFaultURL  = "ALKBLOBFS_S3_FAULT_URL"
	EnvFaultCtl  = "ALKBLOBFS_S3_FAULT_CTL"
	EnvFaultLock = "ALKBLOBFS_S3_FAULT_LOCK"
)

// URL returns an s3:// URL (usable as --large) naming a new, empty prefix
// in the test server's bucket: tests never see each other's blobs.
func URL(t testing.TB) string {
	t.Helper()
	return WithPrefix(t, need(t, EnvURL), Prefix(t))
}

// Available reports whether a test server is configured.
func Available() bool { return os.Getenv(EnvURL) != "" }

// need returns the environment variable or skips (fails under
// ALKBLOBFS_REQUIRE_S3=1).
func need(t testing.TB, env string) string {
	t.Helper()
	v := os.Getenv(env)
	if v != "" {
		return v
	}
	if os.Getenv(EnvRequire) == "1" {
		t.Fatalf("%s is empty but %s=1: run the tests under scripts/s3.sh (make test does)", env, EnvRequire)
	}
	t.Skipf("no S3 test server (%s is empty): run under scripts/s3.sh, as make test does", env)
	return ""
}

var unsafe = regexp.MustCompile(`[^A-Za-z0-9_-]+`)

// Prefix is a fresh prefix named after the test: t-NAME-RANDOM.
func Prefix(t testing.TB) string {
	var r [4]byte
	rand.Read(r[:])
	name := strings.Trim(unsafe.ReplaceAllString(t.Name(), "-"), "-")
	if len(name) > 60 {
		name = name[len(name)-60:]
	}
	return "t-" + name + "-" + hex.EncodeToString(r[:])
}

// WithPrefix returns base (an s3:// URL) with its path set to prefix.
func WithPrefix(t testing.TB, base, prefix string) string {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil || u.Scheme != "s3" {
		t.Fatalf("s3test: the server URL %q is not an s3:// URL", base)
	}
	u.Path = "/" + prefix
	return u.String()
}

// Fault is a server that a test may stop and restart: the second server
// s3.sh starts, so the rest of the suite, running in parallel in other
// test binaries, is not disturbed. Fault tests serialize on a lock file
// across processes.
type Fault struct {
	// URL names a fresh prefix on the fault server.
	URL              string
	*faultctl.Server // Stop, Start, Restart
}

// FaultServer returns the fault server, holding its lock until t ends
// (faultctl.Take). At the end of the test the server is started again if
// the test left it stopped.
func FaultServer(t testing.TB) *Fault {
	t.Helper()
	base := need(t, EnvFaultURL)
	srv := faultctl.Take(t, need(t, EnvFaultCtl), need(t, EnvFaultLock))
	return &Fault{URL: WithPrefix(t, base, Prefix(t)), Server: srv}
}
