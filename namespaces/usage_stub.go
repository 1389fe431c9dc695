package namespaces

import (
	"context"
	"errors"

	"github.com/alkblobfs/alkblobfs/blob"
)

// errNotYet: the API commit of issue 38; the next commits implement it.
var errNotYet = errors.New("namespaces: quotas: not yet implemented")

// LinkSized implements Registry.
func (m *Mem) LinkSized(ctx context.Context, name string, d blob.Digest, size int64) (bool, error) {
	return false, errNotYet
}

// LinkManySized implements Registry.
func (m *Mem) LinkManySized(ctx context.Context, name string, ds []Sized) (int, error) {
	return 0, errNotYet
}

// Usage implements Registry.
func (m *Mem) Usage(ctx context.Context, name string) (Usage, error) { return Usage{}, errNotYet }

// SetQuota implements Registry.
func (m *Mem) SetQuota(ctx context.Context, name string, q Quota) error { return errNotYet }

// Recount implements Registry.
func (m *Mem) Recount(ctx context.Context) (int, error) { return 0, errNotYet }

// LinkSized implements Registry.
func (r *SQL) LinkSized(ctx context.Context, name string, d blob.Digest, size int64) (bool, error) {
	return false, errNotYet
}

// LinkManySized implements Registry.
func (r *SQL) LinkManySized(ctx context.Context, name string, ds []Sized) (int, error) {
	return 0, errNotYet
}

// Usage implements Registry.
func (r *SQL) Usage(ctx context.Context, name string) (Usage, error) { return Usage{}, errNotYet }

// SetQuota implements Registry.
func (r *SQL) SetQuota(ctx context.Context, name string, q Quota) error { return errNotYet }

// Recount implements Registry.
func (r *SQL) Recount(ctx context.Context) (int, error) { return 0, errNotYet }
