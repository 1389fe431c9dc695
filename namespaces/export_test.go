package namespaces

import "context"

// DamageUsage sets a namespace's usage counters behind the registry's
// back, for the tests of Recount (nstest.Damager).
func DamageUsage(r Registry, name string, blobs, bytes int64) error {
	switch r := r.(type) {
	case *Mem:
		r.damageUsage(name, blobs, bytes)
		return nil
	case *SQL:
		_, err := r.db.ExecContext(context.Background(), r.q.setUsage, blobs, bytes, name)
		return err
	}
	panic("DamageUsage of a registry that is neither Mem nor SQL")
}
