//go:build linux

package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// TestRuntimeDirReachable: after a root mount, serve without
// XDG_RUNTIME_DIR listens on /run/alkblobfs/http.sock, and another user
// (nobody) reaches it, as http.md promises: the runtime directory is
// 0755 whichever process came first, and one an older binary left 0700
// is set back. Before, a root mount's lease locks made the directory
// 0700, serve's MkdirAll left it so, and every other user got nothing.
// The mount also removes the pid file of a mount that is gone, which
// before stayed forever.
func TestRuntimeDirReachable(t *testing.T) {
	clitest.RequireFUSE(t)
	if os.Geteuid() != 0 {
		t.Skip("the runtime directory of root's processes is /run/alkblobfs")
	}
	if _, err := exec.LookPath("runuser"); err != nil {
		t.Skip("runuser is needed to call as another user")
	}
	const dir = "/run/alkblobfs"
	// As an older alkblobfs left it.
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Chmod(dir, 0o755) })
	// The record of a mount that is gone (its daemon killed, its
	// mountpoint never mounted again).
	gone := t.TempDir()
	h := sha256.Sum256([]byte(gone))
	stale := filepath.Join(dir, hex.EncodeToString(h[:8])+".pid")
	if err := os.WriteFile(stale, []byte("999999999 424242 1 "+gone+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.Remove(stale) })

	c := clitest.NewCLI(t)
	mnt := t.TempDir()
	d := clitest.StartDaemon(t, c.Data, mnt)
	defer clitest.StopDaemon(t, d)
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("after a root mount, %s: %v, %v; want mode 0755", dir, fi.Mode(), err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("the pid file of a mount that is gone is still there (%v)", err)
	}
	h = sha256.Sum256([]byte(mnt))
	if fi, err := os.Stat(filepath.Join(dir, hex.EncodeToString(h[:8])+".pid")); err != nil || fi.Mode().Perm()&0o022 != 0 {
		t.Errorf("the live mount's pid file: %v, %v; want it there, written by its owner only", fi.Mode(), err)
	}

	t.Setenv("XDG_RUNTIME_DIR", "")
	s := clitest.StartServeURL(t, c, `url=(unix:\S+)`)
	if s.URL != "unix:"+dir+"/http.sock" {
		t.Fatalf("serve without XDG_RUNTIME_DIR listens on %s; want %s/http.sock", s.URL, dir)
	}
	out, err := exec.Command("runuser", "-u", "nobody", "--", "curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
		"--unix-socket", dir+"/http.sock", "http://x/v1/upkeep/sweep-timer").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "200" {
		fi, _ := os.Stat(dir)
		t.Fatalf("nobody's request to the default socket: %v, %s; want 200 (%s is %v)", err, out, dir, fi.Mode())
	}
	// Stopped so, it removes its socket.
	s.Cmd.Process.Signal(syscall.SIGTERM)
	<-s.Done
}
