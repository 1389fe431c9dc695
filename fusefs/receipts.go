package fusefs

import (
	"container/list"
	"sync"
	"sync/atomic"
)

// DefaultMaxReceipts caps the receipts a mount keeps in memory (about
// 2.5 KiB of daemon RSS each, the kernel's inode and the garbage
// collector's headroom included): past it, the oldest go before their TTL. A cp -r of
// more files than this within one TTL keeps only the newest receipts;
// every file is published all the same.
const DefaultMaxReceipts = 100_000

// receiptList keeps the mount's receipts in publish order, so that past
// the cap the oldest go first. Its lock is a leaf: taken under a file's
// lock, never the other way round.
type receiptList struct {
	mu       sync.Mutex
	l        list.List
	at       map[*fileNode]*list.Element
	evicting atomic.Bool
}

// add puts n at the young end (a re-publish makes it young again).
func (r *receiptList) add(n *fileNode) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil {
		r.at = make(map[*fileNode]*list.Element)
	}
	if e, ok := r.at[n]; ok {
		r.l.MoveToBack(e)
		return
	}
	r.at[n] = r.l.PushBack(n)
}

func (r *receiptList) remove(n *fileNode) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if e, ok := r.at[n]; ok {
		r.l.Remove(e)
		delete(r.at, n)
	}
}

func (r *receiptList) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.l.Len()
}

// oldest returns the oldest receipt and moves it to the young end, so that
// one still in use is looked at again only after the others.
func (r *receiptList) oldest() *fileNode {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.l.Front()
	if e == nil {
		return nil
	}
	r.l.MoveToBack(e)
	return e.Value.(*fileNode)
}

// noteReceipt records a new or re-published receipt and, past the cap,
// starts (once) the eviction of the oldest.
func (f *FS) noteReceipt(n *fileNode) {
	f.receipts.add(n)
	if f.receipts.len() > f.cfg.MaxReceipts && f.receipts.evicting.CompareAndSwap(false, true) {
		go f.evictReceipts()
	}
}

// evictReceipts expires the oldest receipts at rest until the count is
// back under the cap (or every one left is in use).
func (f *FS) evictReceipts() {
	defer f.receipts.evicting.Store(false)
	for tries := f.receipts.len(); f.receipts.len() > f.cfg.MaxReceipts && tries > 0; tries-- {
		n := f.receipts.oldest()
		if n == nil {
			return
		}
		n.mu.Lock()
		if n.detached || n.handles > 0 || n.up != nil || n.pub == nil {
			n.mu.Unlock()
			continue
		}
		n.detachLocked()
		n.mu.Unlock()
		f.stats.receiptsEvicted.Add(1)
		removeName(&n.Inode)
	}
}
