//go:build linux

package fusefs

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	"github.com/alkblobfs/alkblobfs/fusefs/fusetest"
	"github.com/alkblobfs/alkblobfs/upkeep"
)

// TestReportsRedacted: the scrub report and stats name the digest a scrub
// found corrupt to root (the mounting user here), and give any other user
// the counts alone.
func TestReportsRedacted(t *testing.T) {
	requireFUSE(t)
	data := t.TempDir()
	e := mountOn(t, data, defaultSpec.open(t, data), func(c *Config) { c.AllowOther = true })
	fusetest.Reachable(t, e.mnt)
	bob := fusetest.NewUser(t)
	e.mkns("private")
	if err := os.Chmod(e.path("private"), 0o700); err != nil {
		t.Fatal(err)
	}
	d := e.put("private", randBytes(43, 300<<10)).String() // a local large blob
	if err := os.WriteFile(e.blobFile(d), randBytes(44, 300<<10), 0o444); err != nil {
		t.Fatal(err)
	}
	writeFile(t, e.path(".alkblobfs", "scrub"), []byte("run\n"))

	for _, file := range []string{"scrub", "stats"} {
		path := e.path(".alkblobfs", file)
		root, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(root), d) {
			t.Errorf("root's %s does not name the corrupt blob:\n%s", file, root)
		}
		out, err := bob.Sh("cat " + path)
		if err != nil {
			t.Fatalf("bob reads %s: %v %s", file, err, out)
		}
		if strings.Contains(out, d) {
			t.Errorf("bob's %s names a digest of a 0700 namespace:\n%s", file, out)
		}
		var rep upkeep.ScrubReport
		if file == "scrub" {
			if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Corrupt != 1 {
				t.Errorf("bob's scrub report lacks the count: %v %s", err, out)
			}
		}
	}
}
