package fusefs

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
)

// TestHandoverOptionsAndVersion: a successor whose options fixed at mount
// time differ is refused naming the option; a state in a newer format, or
// without a version, is refused with a message; the current one is read.
func TestHandoverOptionsAndVersion(t *testing.T) {
	fsWith := func(c Config) *FS { return &FS{cfg: c, log: slog.New(slog.DiscardHandler)} }
	f := fsWith(Config{Source: "/srv/blobs"})
	have := f.fixedOptions()
	if err := checkFixed(have, f.fixedOptions()); err != nil {
		t.Fatalf("the same options refused: %v", err)
	}
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Source: "/srv/blobs", AllowOther: true}, `option --allow-other: the mount has "false" and this build would have "true"`},
		{Config{Source: "/srv/blobs", ReadOnly: true}, `option --read-only: the mount has "false" and this build would have "true"`},
		{Config{Source: "other"}, `option --source: the mount has "/srv/blobs" and this build would have "other"`},
	} {
		g := fsWith(tc.cfg)
		err := checkFixed(have, g.fixedOptions())
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
	changed := f.fixedOptions()
	changed["max_write"] = "131072"
	if err := checkFixed(changed, have); err == nil || !strings.Contains(err.Error(), "option max_write:") {
		t.Errorf("a different max_write: %v", err)
	}
	older := f.fixedOptions()
	delete(older, "capabilities")
	if err := checkFixed(older, have); err == nil || !strings.Contains(err.Error(), "option capabilities: the mount does not record it") {
		t.Errorf("an option the mount did not record: %v", err)
	}

	state := func(v int) []byte {
		b, err := json.Marshal(handoverState{Version: v, Dir: "/mnt", Table: &gofs.TableState{Version: gofs.TableStateVersion},
			Init: fuse.InitState{Version: fuse.InitStateVersion, KernelMajor: 7, Major: 7, KernelMinor: 41, Minor: 41, MaxWrite: 1 << 20}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	if st, err := decodeHandover(state(HandoverVersion)); err != nil || st.Dir != "/mnt" {
		t.Fatalf("the current version: %v", err)
	}
	if _, err := decodeHandover(state(HandoverVersion + 1)); err == nil || !strings.Contains(err.Error(), "handover state version 2 is newer than this build reads (1)") {
		t.Errorf("a newer version: %v", err)
	}
	if _, err := decodeHandover(state(0)); err == nil || !strings.Contains(err.Error(), "no version") {
		t.Errorf("no version: %v", err)
	}
}
