package engines

import (
	"errors"
	"io"
)

// ReadAtSized is io.ReaderAt's contract for a cursor of size bytes whose
// read fills a prefix of p (at least one byte) from an offset below size:
// it reads until p is full or the blob ends, returning io.EOF with a short
// count at the end. read's errors are returned as they are, for the
// cursor to wrap.
func ReadAtSized(p []byte, off, size int64, read func(p []byte, off int64) (int, error)) (int, error) {
	if off < 0 {
		return 0, errors.New("negative offset")
	}
	if off >= size {
		return 0, io.EOF
	}
	want := p[:min(int64(len(p)), size-off)]
	n := 0
	for n < len(want) {
		k, err := read(want[n:], off+int64(n))
		n += k
		if err != nil {
			return n, err
		}
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}
