package meta_test

import (
	"testing"

	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/mem"
	"github.com/alkblobfs/alkblobfs/meta/metatest"
)

// TestMemLedger: the mem dialect is the ledger alone, in the process: the
// "second process" is the same engine, whose ledger outlives its Close.
func TestMemLedger(t *testing.T) {
	var e *mem.Engine
	metatest.Ledger(t, func(t *testing.T) engines.Engine {
		if e == nil {
			e = mem.New()
		}
		return e
	})
}
