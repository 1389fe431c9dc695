package main

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/store"
)

func newGetCmd(a *app) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:         "get DIGEST [-o FILE]",
		Annotations: remoteOK,
		Short:       "Write a blob to a file or to standard output, verified",
		Long: `get reads the blob DIGEST, checking that its content hashes to DIGEST.

With -o FILE it writes to a temporary file beside FILE and renames it to FILE
only once the whole blob has been read and verified: FILE is never left
holding wrong or partial content, and on failure the temporary file is
removed. A symbolic link stays a link: its target is the file replaced.
Anything that is not a regular file — a character device such as /dev/null,
a FIFO, a socket — is never replaced: get writes into it, as cp does, and
like cat reports a failed verification at the end with exit status 1.
Without -o it streams to standard output like cat.`,
		Example: `  alkblobfs get 3f0a…e91c -o app.tar
  alkblobfs get 3f0a…e91c > app.tar`,
		Args: argsRange(1, 1, "one DIGEST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := parseDigest(cmd, args[0])
			if err != nil {
				return err
			}
			src, closeSrc, err := a.blobSource(cmd)
			if err != nil {
				return err
			}
			defer closeSrc()
			if out == "" || out == "-" {
				err = a.stream(cmd, src, d, a.stdout, true)
			} else {
				err = a.getToFile(cmd, src, d, out)
			}
			if err != nil {
				return err
			}
			return closeSrc()
		},
	}
	cmd.Flags().StringVarP(&out, "output", "o", "", "write to `FILE` (replaced atomically once verified)")
	return cmd
}

func newCatCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:         "cat DIGEST",
		Annotations: remoteOK,
		Short:       "Stream a blob to standard output",
		Long: `cat streams the blob DIGEST to standard output as it reads it. The content
is verified as it flows: no byte of a 64 KiB chunk is written before the chunk
passed its checksum, and the whole is checked against DIGEST at the end. On a
failure cat stops and exits with status 1; what it wrote is a correct but
partial prefix, so a pipeline must check the exit status. Use get -o to never
see a partial file.`,
		Example: `  alkblobfs cat 3f0a…e91c | tar -t
  alkblobfs cat 3f0a…e91c | sha256sum`,
		Args: argsRange(1, 1, "one DIGEST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			d, err := parseDigest(cmd, args[0])
			if err != nil {
				return err
			}
			src, closeSrc, err := a.blobSource(cmd)
			if err != nil {
				return err
			}
			defer closeSrc()
			if err := a.stream(cmd, src, d, a.stdout, false); err != nil {
				return err
			}
			return closeSrc()
		},
	}
}

// parseDigest parses a DIGEST argument; a malformed one is a usage error
// (it wraps store.ErrKeyInvalid, which main maps to exit status 2).
func parseDigest(cmd *cobra.Command, s string) (store.Digest, error) {
	d, err := store.ParseDigest(s)
	if err != nil {
		return d, usage(cmd, err)
	}
	return d, nil
}

// parseDigests parses DIGEST arguments with parseDigest, stopping at the
// first bad one.
func parseDigests(cmd *cobra.Command, args []string) ([]store.Digest, error) {
	ds := make([]store.Digest, len(args))
	for i, s := range args {
		d, err := parseDigest(cmd, s)
		if err != nil {
			return nil, err
		}
		ds[i] = d
	}
	return ds, nil
}

// stream copies blob d to w, verifying at the end; progress is drawn on a
// terminal only when asked (get, not cat).
func (a *app) stream(cmd *cobra.Command, src blobSource, d store.Digest, w io.Writer, progress bool) error {
	r, err := src(cmd, d)
	if err != nil {
		return err
	}
	defer r.Close()
	return a.copyBlob(cmd, r, w, progress)
}

// blobReader is an open blob that verifies as it is read: a store's
// Reader, or a remote server's body.
type blobReader interface {
	io.WriterTo
	Len() int64
	Digest() store.Digest
	Close() error
}

// blobSource opens d for reading; a miss is an error wrapping ErrMissing.
type blobSource func(cmd *cobra.Command, d store.Digest) (blobReader, error)

// blobSource opens the store, or the --remote server, that get and cat
// read from. close may be called more than once.
func (a *app) blobSource(cmd *cobra.Command) (src blobSource, close func() error, err error) {
	if a.remote != "" {
		c, err := a.client(cmd)
		if err != nil {
			return nil, nil, err
		}
		return func(cmd *cobra.Command, d store.Digest) (blobReader, error) {
			return openRemote(cmd, c, d)
		}, func() error { return nil }, nil
	}
	st, err := a.open(cmd)
	if err != nil {
		return nil, nil, err
	}
	return func(cmd *cobra.Command, d store.Digest) (blobReader, error) {
		r, ok, err := st.Get(cmd.Context(), d)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("%s: %w", d, store.ErrMissing)
		}
		return r, nil
	}, st.Close, nil
}

func (a *app) copyBlob(cmd *cobra.Command, r blobReader, w io.Writer, progress bool) error {
	t := newTransfer(cmd.Context(), a.stderr, progress && a.stderrTerm, r.Len(), "get "+r.Digest().Short())
	// WriteTo, not io.Copy: the store reader streams in large reads and
	// returns the verification verdict at the end.
	_, err := r.WriteTo(t.writer(w))
	t.done(err)
	return err
}

// getToFile writes blob d to a temporary file beside path and renames it
// over path only after the verified read has completed. A symlink is
// followed (the link stays); a path that is not a regular file is written
// into, never replaced. Errors name path, not the temporary file.
func (a *app) getToFile(cmd *cobra.Command, src blobSource, d store.Digest, path string) (err error) {
	target := path
	switch li, lerr := os.Lstat(path); {
	case lerr != nil && !errors.Is(lerr, fs.ErrNotExist):
		return lerr
	case lerr == nil && li.Mode()&fs.ModeSymlink != 0:
		fi, err := os.Stat(path)
		if err != nil {
			return fmt.Errorf("%s: symbolic link to nothing (%w); give the target's path", path, err)
		}
		if fi.Mode().IsRegular() {
			if target, err = filepath.EvalSymlinks(path); err != nil {
				return err
			}
		} else if fi.IsDir() {
			return fmt.Errorf("%s: is a directory", path)
		} else {
			return a.getInto(cmd, src, d, path)
		}
	case lerr == nil && li.IsDir():
		return fmt.Errorf("%s: is a directory", path)
	case lerr == nil && !li.Mode().IsRegular():
		return a.getInto(cmd, src, d, path)
	}
	// Open before creating anything, so a missing blob leaves no trace.
	r, err := src(cmd, d)
	if err != nil {
		return err
	}
	defer r.Close()
	tmp, err := createTemp(target)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			if rerr := os.Remove(tmp.Name()); rerr != nil && !errors.Is(rerr, fs.ErrNotExist) {
				a.log.Warn("remove temporary file", "path", tmp.Name(), "err", rerr)
			}
		}
	}()
	if err := a.copyBlob(cmd, r, tmp, true); err != nil {
		return userPath(path, tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return userPath(path, tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return userPath(path, tmp.Name(), err)
	}
	return userPath(path, tmp.Name(), os.Rename(tmp.Name(), target))
}

// getInto writes blob d into the existing non-regular file at path (a
// device, a FIFO), as cp does: it cannot be replaced, and its type stays.
func (a *app) getInto(cmd *cobra.Command, src blobSource, d store.Digest, path string) error {
	r, err := src(cmd, d)
	if err != nil {
		return err
	}
	defer r.Close()
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	if err := a.copyBlob(cmd, r, f, true); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// userPath states an I/O error about the temporary file tmp in terms of
// the path the user gave; other errors pass unchanged.
func userPath(path, tmp string, err error) error {
	if err == nil {
		return nil
	}
	var pe *fs.PathError
	var le *os.LinkError
	switch {
	case errors.As(err, &pe) && pe.Path == tmp:
		return fmt.Errorf("%s: %s: %w", path, pe.Op, pe.Err)
	case errors.As(err, &le) && le.Old == tmp:
		return fmt.Errorf("%s: %s: %w", path, le.Op, le.Err)
	}
	return err
}

// createTemp creates ".<base>.<random>.alkblobfs-tmp" beside path. Unlike
// os.CreateTemp it asks for mode 0666 so that the umask decides the final
// file's permissions, as for any file a user creates.
func createTemp(path string) (*os.File, error) {
	dir, base := filepath.Split(path)
	for range 10 {
		var b [6]byte
		rand.Read(b[:])
		name := filepath.Join(dir, "."+base+"."+hex.EncodeToString(b[:])+".alkblobfs-tmp")
		f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o666)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, err
	}
	return nil, fmt.Errorf("%s: could not create a temporary file beside it", path)
}
