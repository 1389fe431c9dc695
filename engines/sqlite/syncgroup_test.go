package sqlite

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// runNo is the error a test run returns: its number.
type runNo int64

func (r runNo) Error() string { return "run" }

// TestSyncGroupRunStartsAfterCall: every caller is answered by a run that
// started after it called (one running when it arrived may predate its
// commit), runs never overlap, and concurrent callers share runs.
func TestSyncGroupRunStartsAfterCall(t *testing.T) {
	var g syncGroup
	var started, running atomic.Int64
	fn := func() error {
		n := started.Add(1)
		if running.Add(1) != 1 {
			t.Error("two runs at once")
		}
		time.Sleep(200 * time.Microsecond)
		running.Add(-1)
		return runNo(n)
	}
	const callers, each = 32, 50
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for range each {
				before := started.Load()
				var r runNo
				if err := g.do(context.Background(), fn); !errors.As(err, &r) {
					t.Errorf("do: %v", err)
					return
				}
				if int64(r) <= before {
					t.Errorf("answered by run %d, which started before the call (%d had)", r, before)
					return
				}
			}
		})
	}
	wg.Wait()
	if n := started.Load(); n >= callers*each {
		t.Errorf("%d runs for %d calls: none shared", n, callers*each)
	}
	g.close()
	if err := g.do(context.Background(), fn); err == nil || errors.As(err, new(runNo)) {
		t.Fatalf("do after close: %v; want ErrClosed", err)
	}
}

// TestSyncGroupWaiterCanceled: a caller waiting for the next run returns
// when its context ends; the run still happens for the caller running it.
func TestSyncGroupWaiterCanceled(t *testing.T) {
	var g syncGroup
	release := make(chan struct{})
	first := make(chan error)
	go func() { first <- g.do(context.Background(), func() error { <-release; return nil }) }()
	for { // until the first run holds the group
		g.mu.Lock()
		busy := g.last != nil
		g.mu.Unlock()
		if busy {
			break
		}
		time.Sleep(time.Millisecond)
	}
	second := make(chan error)
	ran := make(chan struct{})
	go func() { second <- g.do(context.Background(), func() error { close(ran); return nil }) }()
	for { // until the second queued its run
		g.mu.Lock()
		queued := g.queued != nil
		g.mu.Unlock()
		if queued {
			break
		}
		time.Sleep(time.Millisecond)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := g.do(ctx, func() error { t.Error("a joining caller ran the sync"); return nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled waiter: %v", err)
	}
	close(release)
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if err := <-second; err != nil {
		t.Fatal(err)
	}
	<-ran
	g.close()
}
