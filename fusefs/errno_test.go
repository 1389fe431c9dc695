package fusefs

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"syscall"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/upkeep"
)

// TestToErrno is the errno table (docs/errors.md) as data: every row, wrapped
// the way the layers below wrap, maps to its errno.
func TestToErrno(t *testing.T) {
	d := blob.Sum([]byte("x"))
	wrapped := func(err error) error { return blob.Wrap("read", "local:/srv", d, err) }
	nsErr := func(err error) error { return &namespaces.Error{Op: "remove", Namespace: "b", Err: err} }
	for _, c := range []struct {
		name string
		err  error
		want syscall.Errno
	}{
		{"nil", nil, 0},
		{"interrupted", context.Canceled, syscall.EINTR},
		{"interrupted, wrapped", fmt.Errorf("sweep: %w", context.Canceled), syscall.EINTR},
		{"deadline", context.DeadlineExceeded, syscall.ETIMEDOUT},
		{"write to a blob", errReadOnly, syscall.EACCES},
		{"chmod/rename/link/mkdir in ns", errNotPermitted, syscall.EPERM},
		{"bad control input", fmt.Errorf("%w: sweep-timer", errBadInput), syscall.EINVAL},
		{"rmdir non-empty incoming dir", errDirNotEmpty, syscall.ENOTEMPTY},
		{"rename noreplace", errExists, syscall.EEXIST},
		{"rename across namespaces", errCrossDevice, syscall.EXDEV},
		{"rename across namespaces, open for writing", errBeingWritten, syscall.EBUSY},
		{"is a directory", errIsDir, syscall.EISDIR},
		{"not a directory", errNotDir, syscall.ENOTDIR},
		{"fallocate", errUnsupported, syscall.EOPNOTSUPP},
		{"control command during unmount", upkeep.ErrStopped, syscall.ESHUTDOWN},
		{"no xattr", errNoAttr, syscall.ENODATA},
		{"xattr buffer", errRange, syscall.ERANGE},
		{"vanished", errGone, syscall.ENOENT},
		{"opened after its name went", errStaleName, syscall.ESTALE},
		{"name too long", errNameTooLong, syscall.ENAMETOOLONG},
		{"store full", wrapped(blob.ErrNoSpace), syscall.ENOSPC},
		{"namespace at its quota", nsErr(blob.ErrQuota), syscall.EDQUOT},
		{"failed publish", errPublishFailed, syscall.EIO},
		{"missing blob", wrapped(blob.ErrMissing), syscall.ENOENT},
		{"malformed digest", blob.ErrKeyInvalid, syscall.ENOENT},
		{"verification", wrapped(blob.ErrVerification), syscall.EIO},
		{"lost blob (linked, no content)", wrapped(blob.ErrLost), syscall.EIO},
		{"too large", fmt.Errorf("upload: %w", blob.ErrTooLarge), syscall.ENOSPC},
		{"gc refuse", blob.ErrGcRefuse, syscall.EBUSY},
		{"store closed", blob.ErrClosed, syscall.EIO},
		{"store on read-only media", blob.ErrReadOnly, syscall.EROFS},
		{"namespace access denied", fmt.Errorf("lookup: %w", namespaces.ErrDenied), syscall.EACCES},
		{"namespace change by non-owner", fmt.Errorf("chmod: %w", namespaces.ErrNotOwner), syscall.EPERM},
		{"namespace exists", nsErr(namespaces.ErrExists), syscall.EEXIST},
		{"namespace not empty", nsErr(namespaces.ErrNotEmpty), syscall.ENOTEMPTY},
		{"namespace not found", nsErr(namespaces.ErrNotFound), syscall.ENOENT},
		{"bad namespace name", nsErr(namespaces.ErrBadName), syscall.EINVAL},
		{"disk full", wrapped(&fs.PathError{Op: "write", Path: "/x", Err: syscall.ENOSPC}), syscall.ENOSPC},
		{"quota", wrapped(&os.SyscallError{Syscall: "pwrite", Err: syscall.EDQUOT}), syscall.ENOSPC},
		{"backend I/O", wrapped(&fs.PathError{Op: "read", Path: "/x", Err: syscall.EIO}), syscall.EIO},
		{"backend ENOSYS is not ENOSYS", wrapped(syscall.ENOSYS), syscall.EIO},
		{"unknown", errors.New("something odd"), syscall.EIO},
	} {
		if got := toErrno(c.err); got != c.want {
			t.Errorf("%s: toErrno(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}

func TestDigestOf(t *testing.T) {
	d := blob.Sum([]byte("y"))
	if got := digestOf(fmt.Errorf("ctx: %w", blob.Wrap("read", "e", d, blob.ErrVerification))); got != d {
		t.Fatalf("digestOf = %s", got)
	}
	if got := digestOf(errors.New("plain")); !got.IsZero() {
		t.Fatalf("digestOf(plain) = %s", got)
	}
}

func TestBlobAttr(t *testing.T) {
	var d blob.Digest
	d[7] = 3 // first eight bytes: 3, inside the fixed range
	a := blobAttr(d)
	if a.Ino < inoReserved {
		t.Fatalf("ino %d collides with the fixed inodes", a.Ino)
	}
	d2 := blob.Sum([]byte("z"))
	if a2 := blobAttr(d2); a2.Ino>>56 != uint64(d2[0]) || a2.Gen == 0 {
		t.Fatalf("ino %x is not the digest prefix", a2.Ino)
	}
}

func TestParseVerify(t *testing.T) {
	for _, s := range []string{"full", "publish"} {
		if _, err := ParseVerify(s); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := ParseVerify("fast"); err == nil {
		t.Fatal("ParseVerify(fast) succeeded")
	}
}
