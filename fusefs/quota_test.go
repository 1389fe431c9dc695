package fusefs

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/alkblobfs/alkblobfs/namespaces"
)

// TestQuotaStatfs: a namespace's quota over the store's statfs figures:
// the byte quota is the size in the store's fragments, the usage the used
// part (both rounded up), what is available the smaller of what the quota
// and the disk leave; a blob quota is the inode count. No quota leaves the
// store's figures as they are.
func TestQuotaStatfs(t *testing.T) {
	disk := fuse.StatfsOut{Blocks: 1000, Bfree: 600, Bavail: 500, Files: 100, Ffree: 50, Bsize: 4096, Frsize: 4096}
	for _, tc := range []struct {
		name string
		in   fuse.StatfsOut
		u    namespaces.Usage
		want fuse.StatfsOut
	}{
		{"no quota", disk, namespaces.Usage{Blobs: 3, Bytes: 5000}, disk},
		{"bytes", disk, namespaces.Usage{Blobs: 3, Bytes: 8193, Quota: namespaces.Quota{Bytes: 1 << 20}},
			fuse.StatfsOut{Blocks: 256, Bfree: 253, Bavail: 253, Files: 100, Ffree: 50, Bsize: 4096, Frsize: 4096}},
		{"bytes, the disk fuller than the quota", disk, namespaces.Usage{Quota: namespaces.Quota{Bytes: 1 << 30}},
			fuse.StatfsOut{Blocks: 262144, Bfree: 262144, Bavail: 500, Files: 100, Ffree: 50, Bsize: 4096, Frsize: 4096}},
		{"over the quota (lowered below usage)", disk, namespaces.Usage{Bytes: 10 << 20, Quota: namespaces.Quota{Bytes: 1 << 20}},
			fuse.StatfsOut{Blocks: 256, Bfree: 0, Bavail: 0, Files: 100, Ffree: 50, Bsize: 4096, Frsize: 4096}},
		{"blobs", disk, namespaces.Usage{Blobs: 3, Quota: namespaces.Quota{Blobs: 10}},
			fuse.StatfsOut{Blocks: 1000, Bfree: 600, Bavail: 500, Files: 10, Ffree: 7, Bsize: 4096, Frsize: 4096}},
		{"blobs over", disk, namespaces.Usage{Blobs: 12, Quota: namespaces.Quota{Blobs: 10}},
			fuse.StatfsOut{Blocks: 1000, Bfree: 600, Bavail: 500, Files: 10, Ffree: 0, Bsize: 4096, Frsize: 4096}},
		{"a store without a disk (memory, S3)", fuse.StatfsOut{Bsize: 4096, Frsize: 4096}, namespaces.Usage{Bytes: 4096, Quota: namespaces.Quota{Bytes: 3 * 4096}},
			fuse.StatfsOut{Blocks: 3, Bfree: 2, Bavail: 2, Bsize: 4096, Frsize: 4096}},
	} {
		got := tc.in
		quotaStatfs(&got, tc.u)
		if got != tc.want {
			t.Errorf("%s:\n got %+v\nwant %+v", tc.name, got, tc.want)
		}
	}
}

// uniqueCounter counts the calls of Registry.Unique, the query over all of
// a namespace's references and intents.
type uniqueCounter struct {
	namespaces.Registry
	calls atomic.Int64
}

func (u *uniqueCounter) Unique(ctx context.Context, name string) (namespaces.UniqueUsage, error) {
	u.calls.Add(1)
	return u.Registry.Unique(ctx, name)
}

// TestStatfsCountersOnly: df on a namespace directory reads the counters
// kept with its rows, not the unique figures, which are a query over all
// of the namespace's references: on a large namespace a df would take
// seconds.
func TestStatfsCountersOnly(t *testing.T) {
	reg := &uniqueCounter{}
	e := mountStore(t, defaultSpec, func(c *Config) {
		reg.Registry = c.Namespaces
		c.Namespaces = reg
	})
	dir := e.mkns("q")
	e.fill("q", 3)
	if err := e.reg.SetQuota(t.Context(), "q", namespaces.Quota{Blobs: 10}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{dir, filepath.Join(dir, "incoming")} {
		var st syscall.Statfs_t
		if err := syscall.Statfs(p, &st); err != nil {
			t.Fatal(err)
		}
		if st.Files != 10 || st.Ffree != 7 {
			t.Errorf("statfs %s: %d inodes, %d free; want the quota's 10, 7", p, st.Files, st.Ffree)
		}
	}
	if n := reg.calls.Load(); n != 0 {
		t.Errorf("df ran the unique query %d times, want 0", n)
	}
}
