package mem_test

import (
	"testing"

	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/enginetest"
	"github.com/alkblobfs/alkblobfs/engines/mem"
)

func TestEngine(t *testing.T) {
	enginetest.Run(t, func(t *testing.T) engines.Engine { return mem.New() })
}

func TestCorruptLedger(t *testing.T) {
	var e *mem.Engine
	enginetest.CorruptLedger(t, func(t *testing.T) engines.Engine {
		if e == nil {
			e = mem.New()
		}
		return e
	})
}
