package metatest

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/alkblobfs/alkblobfs/meta"
)

// HoldWriter queues on b a job that holds its runner, and returns once
// that job runs (or an error after a minute): the jobs queued from then
// on share b's next transaction, in queue order, once release is called.
// Tests use it to put chosen jobs in one batch (a rollback that takes the
// others with it, a canceled caller beside another writer).
func HoldWriter(ctx context.Context, b *meta.Batcher) (release func(), err error) {
	started, stop := make(chan struct{}), make(chan struct{})
	go b.Do(ctx, false, func(context.Context, *sql.Tx) error {
		close(started)
		<-stop
		return nil
	})
	select {
	case <-started:
	case <-time.After(time.Minute):
		close(stop)
		return nil, errors.New("test: the Batcher did not start the holding job in a minute")
	}
	return func() { close(stop) }, nil
}
