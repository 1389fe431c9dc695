package store

import (
	"errors"
	"fmt"

	"github.com/alkblobfs/alkblobfs/engines"
)

// ErrFleetConfig: a store declared Fleet whose engines cannot be shared by
// several hosts.
var ErrFleetConfig = errors.New("invalid fleet configuration")

// checkFleet is the fleet-validity predicate, checked at construction
// because a fleet cannot be detected, only declared:
//
//   - the kv engine is PostgreSQL: it hosts every host's pins, window,
//     namespaces and sweep lease (one GC-state home);
//   - no engine is ephemeral (mem): another host could not see it;
//   - a pglo large tier is in the kv engine's database, so one server
//     holds the pool and its GC state;
//   - a local large tier is declared on shared media (every host mounts
//     it at the same path): that cannot be checked, only declared;
//   - a large tier that is shared media by nature (an S3 bucket: every
//     host that opens the same URL sees the same objects) needs no
//     declaration;
//   - every pool has at least 2 connections.
//
// Design point (pool sizing): the sweep lease and the change feed hold
// sessions of their own, outside the pool, so a pool of 1 cannot wait on
// itself. A fleet host still needs 2: with one, every open, close and
// lookup of its users queues behind each statement of its sweeps and
// puts, and waits of that kind are what the op timeout turns into EIO.
func checkFleet(cfg Config) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("store: %w: %s", ErrFleetConfig, fmt.Sprintf(format, args...))
	}
	kv := cfg.KV
	sq, ok := kv.(engines.SQL)
	if kv == nil || !ok || sq.Dialect() != "postgres" {
		name := "none"
		if kv != nil {
			name = kv.Name()
		}
		return bad("fleet mode needs a PostgreSQL kv engine (--kv postgres://…) to share GC state; the kv engine is %s", name)
	}
	for _, e := range []engines.Engine{cfg.KV, cfg.Large} {
		if eph, ok := e.(engines.Ephemeral); ok && eph.Ephemeral() {
			return bad("%s keeps blobs in one process's memory; no other host can see them", e.Name())
		}
		if loc, ok := e.(engines.Locator); ok && loc.PoolSize() < 2 {
			return bad("%s has a pool of %d connection(s); a fleet host needs at least 2, so that its users' opens and lookups do not queue behind its sweeps and puts", e.Name(), loc.PoolSize())
		}
	}
	if cfg.Large == nil {
		return nil
	}
	kvLoc, _ := kv.(engines.Locator)
	switch large := cfg.Large.(type) {
	case sharedMedium:
		if !large.SharedMedium() {
			return bad("the large tier %s cannot be shared by a fleet", cfg.Large.Name())
		}
	case engines.Locator:
		if kvLoc == nil || large.Instance() != kvLoc.Instance() {
			return bad("the large tier %s is not in the kv engine's database %s; use --large pglo", cfg.Large.Name(), kvLoc.Instance())
		}
	case engines.StatFS:
		if !cfg.SharedMedia {
			return bad("the large tier %s is a local directory; declare that every host mounts it at the same path with --shared-media, or use --large pglo", cfg.Large.Name())
		}
	default:
		return bad("the large tier %s cannot be shared by a fleet", cfg.Large.Name())
	}
	return nil
}

// sharedMedium is implemented by large engines whose storage every host
// reaches at the same address by nature (engines/s3), so that a fleet
// needs no --shared-media declaration for them.
type sharedMedium interface {
	SharedMedium() bool
}
