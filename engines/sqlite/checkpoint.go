package sqlite

import (
	"context"
	"database/sql"
	"sync"
	"sync/atomic"
	"time"
)

// Checkpoints run off the writers' path. SQLite's automatic checkpoint
// runs inside the COMMIT that takes the log past wal_autocheckpoint
// pages, on that writer's connection: here the Batcher's, which every
// write of the process waits behind. It copies a thousand pages into the
// database file and syncs the log and the file, milliseconds in which no
// put commits (a third of the CPU of a stream of 1 KiB HTTP puts, and
// half their rate). So a goroutine of the engine runs a PASSIVE
// checkpoint every checkpointEvery on a connection of its own, which
// copies what it can without waiting for readers or writers, while
// writers go on appending; the automatic one stays as a backstop at
// autoCheckpoint pages, should the goroutine fall behind. Durability is
// unchanged (sync.go): a checkpoint syncs the log before it copies
// frames and the database file after, whichever connection runs it.

// checkpointEvery is how often the checkpointer copies the log into the
// database file while it is being written. A checkpoint that finds
// nothing new doubles the wait before the next one, up to checkpointIdle:
// an idle daemon does not wake ten times a second for nothing.
const (
	checkpointEvery = 100 * time.Millisecond
	checkpointIdle  = 2 * time.Second
)

// autoCheckpoint is the writers' wal_autocheckpoint, in pages: the
// backstop (SQLite's default is 1000).
const autoCheckpoint = 8000

// checkpointer runs the background checkpoints.
type checkpointer struct {
	db   *sql.DB
	stop chan struct{}
	done chan struct{}
	runs atomic.Int64 // checkpoints run (tests read it)
	once sync.Once
}

// startCheckpointer opens a connection of dsn and starts checkpointing
// on it.
func startCheckpointer(dsn string) (*checkpointer, error) {
	db, err := sql.Open("sqlite", dsn)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1)
	db.SetMaxIdleConns(1)
	c := &checkpointer{db: db, stop: make(chan struct{}), done: make(chan struct{})}
	go c.loop()
	return c, nil
}

func (c *checkpointer) loop() {
	defer close(c.done)
	wait := checkpointEvery
	t := time.NewTimer(wait)
	defer t.Stop()
	lastLog := int64(-1)
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		// PASSIVE never waits (nor invokes the busy handler): a
		// checkpoint that cannot copy everything copies what it can, and
		// the next one the rest. A failure (an I/O error) is the next
		// one's to retry; the log's fdatasync (sync.go) reports such
		// errors to those who need them.
		var busy, log, copied int64
		if err := c.db.QueryRowContext(context.Background(), "PRAGMA wal_checkpoint(PASSIVE)").Scan(&busy, &log, &copied); err == nil {
			c.runs.Add(1)
		}
		// The log unchanged since the last run and copied whole: nothing
		// was written. (A writer that restarts the log changes its length.)
		if log == lastLog && copied == log {
			wait = min(2*wait, checkpointIdle)
		} else {
			wait = checkpointEvery
		}
		lastLog = log
		t.Reset(wait)
	}
}

// close stops the checkpointer and closes its connection; later calls do
// nothing (an Engine may be closed twice).
func (c *checkpointer) close() error {
	if c == nil {
		return nil
	}
	var err error
	c.once.Do(func() {
		close(c.stop)
		<-c.done
		err = c.db.Close()
	})
	return err
}
