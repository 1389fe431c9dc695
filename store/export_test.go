package store

import (
	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/gc"
)

// The engines and the collector, for the store's own tests: the facade
// hands out neither.
func (s *Store) GC() *gc.Collector    { return s.gc }
func (s *Store) KV() engines.KV       { return s.kv }
func (s *Store) Large() engines.Large { return s.large }

// SetMissHook installs the hook of Get's lost check (lost.go): it runs
// after the tiers missed, before the link is asked; the result undoes it.
func SetMissHook(missed func(Digest)) func() {
	testHookMissed = missed
	return func() { testHookMissed = nil }
}
