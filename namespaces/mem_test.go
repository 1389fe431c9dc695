package namespaces_test

import (
	"testing"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/namespaces/nstest"
)

func TestMem(t *testing.T) {
	nstest.Run(t, func(t *testing.T, c namespaces.Clock) namespaces.Registry { return namespaces.NewMem(c) })
}

func TestMemUsage(t *testing.T) {
	mem := func(t *testing.T, n int) []namespaces.Registry {
		r := namespaces.NewMem(nil)
		regs := make([]namespaces.Registry, n)
		for i := range regs {
			regs[i] = r
		}
		return regs
	}
	nstest.RunUsage(t, mem, damage)
}

// damage is an nstest.Damager for this package's registries.
func damage(t *testing.T, r namespaces.Registry, name string, blobs, bytes int64) {
	t.Helper()
	if err := namespaces.DamageUsage(r, name, blobs, bytes); err != nil {
		t.Fatal(err)
	}
}
