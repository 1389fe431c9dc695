package fusefs

import (
	"context"
	"syscall"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
)

// A namespace's directory, and everything in its incoming/, answer statfs
// with the namespace's quota and usage, so that df there says how much it
// may still write, as directory quotas of JuiceFS, CephFS and XFS projects
// do. The kernel sends STATFS with the node of the path asked about, so
// the root and other namespaces keep the store's figures.
var (
	_ = (fs.NodeStatfser)((*nsDir)(nil))
	_ = (fs.NodeStatfser)((*incDir)(nil))
	_ = (fs.NodeStatfser)((*fileNode)(nil))
)

// Statfs answers for the namespace.
func (d *nsDir) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return d.statfsNamespace(ctx, out)
}

// Statfs answers for the namespace incoming/ belongs to.
func (d *incDir) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return d.tree.ns.statfsNamespace(ctx, out)
}

// Statfs answers for the namespace the file is written into.
func (n *fileNode) Statfs(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	return n.ns.statfsNamespace(ctx, out)
}

// statfsNamespace is the store's statfs with the namespace's quota laid
// over it: without a limit, the store's own figures.
func (d *nsDir) statfsNamespace(ctx context.Context, out *fuse.StatfsOut) syscall.Errno {
	if e := d.node.Statfs(ctx, out); e != 0 {
		return e
	}
	u, err := d.fsys.reg.Usage(ctx, d.name)
	if err != nil {
		return d.fsys.errno("statfs", blob.Digest{}, err)
	}
	quotaStatfs(out, u)
	return 0
}

// quotaStatfs lays a namespace's quota over the store's figures in out.
// A byte quota becomes the size, in the store's fragments (rounded up, as
// the used part is: df counts whole blocks); a blob quota becomes the
// inode count (df -i). What may still be written is what the quota leaves
// and, when the store reports its disk, what the disk has left.
func quotaStatfs(out *fuse.StatfsOut, u namespaces.Usage) {
	if q := u.Quota.Bytes; q > 0 {
		if out.Frsize == 0 {
			out.Frsize = 4096
		}
		bs := uint64(out.Frsize)
		total := ceilDiv(uint64(q), bs)
		used := min(ceilDiv(uint64(max(u.Bytes, 0)), bs), total)
		free := total - used
		avail := free
		if out.Blocks > 0 { // the store's disk is known
			avail = min(free, out.Bavail)
		}
		out.Blocks, out.Bfree, out.Bavail = total, free, avail
	}
	if q := u.Quota.Blobs; q > 0 {
		out.Files = uint64(q)
		out.Ffree = uint64(q - min(max(u.Blobs, 0), q))
	}
}

func ceilDiv(n, d uint64) uint64 { return (n + d - 1) / d }
