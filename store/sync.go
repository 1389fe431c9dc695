package store

import (
	"context"
	"errors"
	"time"

	"github.com/alkblobfs/alkblobfs/engines"
)

// DefaultSyncEvery is how often, at the most, the store leaves commits
// exposed to a power loss: the kv engine is synced once a second while it
// is written, like ext4's default journal commit of 5 s but shorter, as a
// close(2) in incoming/ is all most writers do.
const DefaultSyncEvery = time.Second

// Sync returns once every transaction and blob committed before the call
// survives a power loss, not only a crash of the process: it syncs each
// engine that commits without syncing (engines.Syncer: SQLite). Engines
// that are durable at commit need nothing. Concurrent calls share the
// engines' syncs.
func (s *Store) Sync(ctx context.Context) error {
	if s.closed.Load() {
		return ErrClosed
	}
	return s.syncEngines(ctx)
}

func (s *Store) syncEngines(ctx context.Context) error {
	var errs []error
	for _, t := range s.tiers() {
		if sy, ok := t.e.(engines.Syncer); ok {
			errs = append(errs, sy.Sync(ctx))
		}
	}
	return errors.Join(errs...)
}

// syncTimer syncs the store's engines every interval, so that a power
// loss takes at most the last interval of commits. An engine's Sync that
// finds nothing committed since its last one costs no disk access, so an
// idle store costs a timer.
type syncTimer struct {
	stop chan struct{}
	done chan struct{}
}

// startSyncTimer starts the timer for cfg.SyncEvery, or returns nil when
// no engine needs syncing or the interval is negative. (A read-only
// engine's Sync returns at once.)
func (s *Store) startSyncTimer(every time.Duration) *syncTimer {
	if every == 0 {
		every = DefaultSyncEvery
	}
	needs := false
	for _, t := range s.tiers() {
		_, ok := t.e.(engines.Syncer)
		needs = needs || ok
	}
	if every < 0 || !needs {
		return nil
	}
	st := &syncTimer{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(st.done)
		tick := time.NewTicker(every)
		defer tick.Stop()
		var last string // the last error logged: a failing disk logs once, not every tick
		for {
			select {
			case <-st.stop:
				return
			case <-tick.C:
			}
			err := s.syncEngines(context.Background())
			switch {
			case err != nil && err.Error() != last:
				s.log.Error("periodic sync failed: commits since the last sync may not survive a power loss", "err", err)
				last = err.Error()
			case err == nil && last != "":
				s.log.Info("periodic sync works again")
				last = ""
			}
		}
	}()
	return st
}

// close stops the timer and waits for a sync it is running.
func (st *syncTimer) close() {
	if st != nil {
		close(st.stop)
		<-st.done
	}
}
