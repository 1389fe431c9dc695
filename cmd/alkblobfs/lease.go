package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"
)

// The GC lease keeps garbage collection to one process per store. Pins are
// in-process: a mount knows which blobs its open files hold, another
// process does not, so a sweep or a direct delete from another process
// could remove a blob the mount is serving. The mount holds the lease for
// its lifetime; `sweep` and `rm` take it for their run and, when another
// process holds it, do nothing (a sweep reports Aborted: SweeperLock, rm
// fails). Two mounts of one store would be the same hazard, so the second
// is refused.
//
// The lease is an flock(2) on a file beside the SQLite database: released
// by the kernel when its holder exits, even by kill -9. Other kv engines
// have no lease here: mem dies with its process, and PostgreSQL stores
// shared by several hosts are fleet mode (DESIGN.md §7).

// errLeaseHeld: another process holds the store's GC lease.
var errLeaseHeld = errors.New("held by another process")

// gcLease is a held lease; release is idempotent. A zero lease (no lease
// file for this store) releases nothing.
type gcLease struct{ f *os.File }

func (l *gcLease) release() {
	if l != nil && l.f != nil {
		l.f.Close() // closing the descriptor drops the flock
		l.f = nil
	}
}

// acquireGCLease takes the lease at path without waiting; "" means the
// store has none. It fails with an error wrapping errLeaseHeld, naming the
// holder's pid, when another process has it.
func acquireGCLease(path string) (*gcLease, error) {
	if path == "" {
		return &gcLease{}, nil
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("gc lease %s: %w", path, err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder := readHolder(f)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			return nil, fmt.Errorf("the store's GC lease %s is %w%s", path, errLeaseHeld, holder)
		}
		return nil, fmt.Errorf("gc lease %s: %w", path, err)
	}
	// Record who holds it, for the message another process prints.
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &gcLease{f: f}, nil
}

func readHolder(f *os.File) string {
	b := make([]byte, 32)
	n, _ := f.ReadAt(b, 0)
	if pid := strings.TrimSpace(string(b[:n])); pid != "" {
		return " (pid " + pid + ")"
	}
	return ""
}
