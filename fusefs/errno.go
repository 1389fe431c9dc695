package fusefs

import (
	"context"
	"errors"
	"log/slog"
	"syscall"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/upkeep"
)

// Policy errors of the mount itself. Node code returns these (or store and
// namespace errors) and converts them in exactly one place, toErrno, so the
// errno a user sees is decided by one table.
var (
	// errReadOnly: opening a blob (or a read-only control file) for
	// writing, truncating it, writing to it. EACCES, root included.
	errReadOnly = errors.New("read-only: blobs are immutable")
	// errNotPermitted: chmod/chown/utimes/rename/link of a blob, mkdir or
	// a non-digest create directly in a namespace, and the like.
	errNotPermitted = errors.New("operation not permitted here")
	// errBadInput: control-file input that is not understood.
	errBadInput = errors.New("invalid input")
	// errDirNotEmpty: rmdir of a non-empty incoming/ subdirectory, or of a
	// namespace whose incoming/ still has puts in flight.
	errDirNotEmpty = errors.New("directory not empty")
	// errExists: rename with RENAME_NOREPLACE onto an existing name.
	errExists = errors.New("file exists")
	// errCrossDevice: rename between two incoming/ trees (mv falls back to
	// copy and unlink).
	errCrossDevice = errors.New("rename across namespaces")
	// errBeingWritten: a rename across namespaces of a file still open for
	// writing, or of a directory holding one: mv's copy would take content
	// still being written.
	errBeingWritten = errors.New("open for writing: close it before moving it to another namespace")
	// errIsDir / errNotDir: rename type mismatches.
	errIsDir  = errors.New("is a directory")
	errNotDir = errors.New("not a directory")
	// errUnsupported: fallocate, foreign xattrs on incoming files.
	errUnsupported = errors.New("not supported")
	// errNoAttr: getxattr of an attribute the file does not have.
	errNoAttr = errors.New("no such attribute")
	// errRange: the caller's xattr buffer is too small.
	errRange = errors.New("buffer too small")
	// errPublishFailed: an incoming file whose publish failed; it can no
	// longer be read, and goes away when its last handle closes.
	errPublishFailed = errors.New("publish failed")
	// errGone: the file was removed while the request was on its way.
	errGone = errors.New("no such file")
	// errStaleName: an open reached a file whose name went (a refused
	// file's at its RELEASE, an unlink) after the kernel resolved the
	// name. ESTALE makes the kernel resolve the path again
	// (LOOKUP_REVAL): the open then finds the name's new file, or creates
	// one with O_CREAT, or fails with ENOENT, as if it had come after.
	errStaleName = errors.New("the name went while the open was on its way")
	// errNameTooLong: a name over nameMax bytes, anywhere in the mount.
	errNameTooLong = errors.New("file name too long")
)

// nameMax is the longest name the mount accepts, in bytes: NAME_MAX, what
// statfs reports and what every Linux filesystem that programs expect
// allows. The kernel does not enforce it for FUSE, so the mount does.
const nameMax = 255

// tooLong returns ENAMETOOLONG for a name over nameMax bytes, else 0.
func tooLong(name string) syscall.Errno {
	if len(name) > nameMax {
		return toErrno(errNameTooLong)
	}
	return 0
}

// toErrno is the one mapping from Go errors to the errno the kernel gets
// (docs/errors.md). It is pure and table-tested; callers go
// through (*FS).errno, which logs every error that maps to EIO with its
// operation and digest before the bare EIO goes to the kernel. Unknown
// errors map to EIO, never to ENOSYS: ENOSYS would make the kernel stop
// sending that operation for the rest of the mount.
func toErrno(err error) syscall.Errno {
	if err == nil {
		return 0
	}
	switch {
	case errors.Is(err, context.Canceled):
		return syscall.EINTR
	case errors.Is(err, context.DeadlineExceeded):
		return syscall.ETIMEDOUT

	case errors.Is(err, errReadOnly):
		return syscall.EACCES
	case errors.Is(err, errNotPermitted):
		return syscall.EPERM
	case errors.Is(err, errBadInput), errors.Is(err, upkeep.ErrBadInput):
		return syscall.EINVAL
	case errors.Is(err, errDirNotEmpty):
		return syscall.ENOTEMPTY
	case errors.Is(err, errExists):
		return syscall.EEXIST
	case errors.Is(err, errCrossDevice):
		return syscall.EXDEV
	case errors.Is(err, errBeingWritten):
		return syscall.EBUSY
	case errors.Is(err, errIsDir):
		return syscall.EISDIR
	case errors.Is(err, errNotDir):
		return syscall.ENOTDIR
	case errors.Is(err, errUnsupported):
		return syscall.EOPNOTSUPP
	case errors.Is(err, upkeep.ErrStopped):
		// A scrub asked for, or running, while the mount unmounts (its
		// upkeep stops then). Not EINTR, which a shell's echo would
		// retry.
		return syscall.ESHUTDOWN
	case errors.Is(err, errNoAttr):
		return syscall.ENODATA
	case errors.Is(err, errRange):
		return syscall.ERANGE
	case errors.Is(err, errGone):
		return syscall.ENOENT
	case errors.Is(err, errStaleName):
		return syscall.ESTALE
	case errors.Is(err, errPublishFailed):
		return syscall.EIO
	case errors.Is(err, errNameTooLong):
		return syscall.ENAMETOOLONG

	case errors.Is(err, blob.ErrMissing), errors.Is(err, blob.ErrKeyInvalid):
		return syscall.ENOENT
	case errors.Is(err, blob.ErrVerification):
		return syscall.EIO
	case errors.Is(err, blob.ErrQuota):
		// Before ErrNoSpace: the namespace's quota, not the store, is full.
		return syscall.EDQUOT
	case errors.Is(err, blob.ErrTooLarge), errors.Is(err, blob.ErrNoSpace):
		return syscall.ENOSPC
	case errors.Is(err, blob.ErrGcRefuse):
		return syscall.EBUSY
	case errors.Is(err, blob.ErrClosed):
		return syscall.EIO
	case errors.Is(err, blob.ErrReadOnly):
		return syscall.EROFS

	case errors.Is(err, namespaces.ErrDenied):
		return syscall.EACCES
	case errors.Is(err, namespaces.ErrNotOwner):
		return syscall.EPERM
	case errors.Is(err, namespaces.ErrExists):
		return syscall.EEXIST
	case errors.Is(err, namespaces.ErrNotEmpty):
		return syscall.ENOTEMPTY
	case errors.Is(err, namespaces.ErrNotFound):
		return syscall.ENOENT
	case errors.Is(err, namespaces.ErrBadName):
		return syscall.EINVAL
	}
	// An errno from the medium under an engine (wrapped in *os.PathError,
	// *blob.Error, ...): pass on what a user can act on, EIO for the rest.
	var en syscall.Errno
	if errors.As(err, &en) {
		switch en {
		case syscall.ENOSPC, syscall.EDQUOT, syscall.EFBIG:
			return syscall.ENOSPC
		case syscall.EINTR:
			return syscall.EINTR
		}
	}
	return syscall.EIO
}

// digestOf digs the digest out of an error chain, for log lines.
func digestOf(err error) blob.Digest {
	var be *blob.Error
	if errors.As(err, &be) && !be.Digest.IsZero() {
		return be.Digest
	}
	var ne *namespaces.Error
	if errors.As(err, &ne) {
		return ne.Digest
	}
	return blob.Digest{}
}

// errno converts err for the kernel. Errors that end up as EIO (backend
// failures, verification failures, anything unknown) are logged first,
// naming the operation, the path or digest and the engine's message, since
// the bare EIO carries nothing. Expected answers (ENOENT, EPERM, ...) are
// logged at debug level only.
// errnoLevel is the level at which a request answered e is logged: EIO
// always at error; a READ's other errors (ESTALE, EINTR, ENOMEM: a read
// of an open file has no ordinary failure) at warning, so that a failed
// run's log says what a reader got; the ordinary answers of other
// requests (ENOENT, ENODATA, EACCES, by the thousand) at debug.
func errnoLevel(op string, e syscall.Errno) slog.Level {
	switch {
	case e == syscall.EIO:
		return slog.LevelError
	case op == "read":
		return slog.LevelWarn
	}
	return slog.LevelDebug
}

func (f *FS) errno(op string, d blob.Digest, err error) syscall.Errno {
	e := toErrno(err)
	if e == 0 {
		return 0
	}
	lvl := errnoLevel(op, e)
	if !f.log.Enabled(context.Background(), lvl) {
		return e // the common case: ENOENT, ENODATA answers by the thousand
	}
	if d.IsZero() {
		d = digestOf(err)
	}
	attrs := []any{"op", op, "errno", e.Error(), "err", err}
	if !d.IsZero() {
		attrs = append(attrs, "digest", d.String())
	}
	// A store error names its engine; a registry error names the
	// database it is kept in.
	var ne *namespaces.Error
	if r, ok := f.reg.(interface{ Dialect() string }); ok && errors.As(err, &ne) {
		attrs = append(attrs, "engine", r.Dialect())
	}
	f.log.Log(context.Background(), lvl, "request failed", attrs...)
	return e
}
