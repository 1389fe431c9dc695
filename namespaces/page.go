package namespaces

import (
	"context"
	"iter"

	"github.com/alkblobfs/alkblobfs/blob"
)

// paged turns a keyset page fetcher into a stream. fetch gets the last
// element of the previous page (first is true for the first page) and
// returns the next page of at most pageSize elements, read whole: no lock,
// cursor or transaction is held while the consumer's loop body runs. A
// short page ends the stream; an error ends it as the last pair, wrapped
// with op and name.
func paged[T any](ctx context.Context, op, name string, fetch func(first bool, last T) ([]T, error)) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		var zero, last T
		for first := true; ; first = false {
			if err := ctx.Err(); err != nil {
				yield(zero, wrap(op, name, blob.Digest{}, err))
				return
			}
			page, err := fetch(first, last)
			if err != nil {
				yield(zero, wrap(op, name, blob.Digest{}, err))
				return
			}
			for _, v := range page {
				if !yield(v, nil) {
					return
				}
			}
			if len(page) < pageSize {
				return
			}
			last = page[len(page)-1]
		}
	}
}

// fail is a stream of one error.
func fail[T any](err error) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		var zero T
		yield(zero, err)
	}
}
