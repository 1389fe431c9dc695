package namespaces

import (
	"context"

	"github.com/alkblobfs/alkblobfs/engines"
)

// DamageUsage sets a namespace's usage counters behind the registry's
// back, for the tests of Recount (nstest.Damager).
func DamageUsage(r Registry, name string, blobs, bytes int64) error {
	switch r := r.(type) {
	case *Mem:
		r.damageUsage(name, blobs, bytes)
		return nil
	case *SQL:
		_, err := r.db.ExecContext(context.Background(), engines.Rebind(r.Dialect(), `UPDATE ns SET blobs = ?, bytes = ? WHERE name = ?`), blobs, bytes, name)
		return err
	}
	panic("DamageUsage of a registry that is neither Mem nor SQL")
}
