package ops

import (
	"crypto/rand"
	"encoding/base64"
	"sync"
	"time"

	"github.com/alkblobfs/alkblobfs/store"
)

// tokens maps pin tokens to the pins they name. A token is the pin a put
// handed out (seeds ADR-010 §4: the token is the pin, there is no second
// pin state): while the token lives, its store.Pin is held, which protects the
// blob in this process and, where the store keeps pin rows, in every process
// and host sharing the pool. A token lives TTL after its put or its last
// renewal; then its pin is released and the token is forgotten.
//
// The mapping is in memory: a token is valid only on the server that minted
// it, for that server's life. After a restart the putter's renewal answers
// present=false and the putter re-puts, which is the contract's backstop
// for any lapse.
//
// Each token is its minter's: only the principal that put (or root) renews
// or releases it, and one principal holds at most max live tokens (counted
// in per, reserved before its put starts).
type tokens struct {
	ttl   time.Duration
	clock store.Clock
	max   int

	mu  sync.Mutex
	m   map[string]*token
	per map[uint32]int
}

type token struct {
	pin     *store.Pin
	ns      string
	uid     uint32 // the minter
	expires time.Time
}

func newTokens(ttl time.Duration, clock store.Clock, max int) *tokens {
	return &tokens{ttl: ttl, clock: clock, max: max, m: make(map[string]*token), per: make(map[uint32]int)}
}

// reserve counts a token uid is about to mint, and reports false, counting
// nothing, if uid holds max already. A reservation ends in mint or unreserve.
func (t *tokens) reserve(uid uint32) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.per[uid] >= t.max {
		return false
	}
	t.per[uid]++
	return true
}

func (t *tokens) unreserve(uid uint32) {
	t.mu.Lock()
	t.dropLocked(uid)
	t.mu.Unlock()
}

func (t *tokens) dropLocked(uid uint32) {
	if t.per[uid]--; t.per[uid] <= 0 {
		delete(t.per, uid)
	}
}

// mint takes ownership of pin and returns a fresh token naming it, minted
// by uid on its reservation.
func (t *tokens) mint(pin *store.Pin, ns string, uid uint32) string {
	id := t.newID()
	t.mu.Lock()
	defer t.mu.Unlock()
	t.m[id] = &token{pin: pin, ns: ns, uid: uid, expires: t.clock.Now().Add(t.ttl)}
	return id
}

// newID is a fresh token: 18 random bytes, base64url.
func (t *tokens) newID() string {
	var b [18]byte
	rand.Read(b[:]) // never fails (crypto/rand)
	return base64.RawURLEncoding.EncodeToString(b[:])
}

// mine reports whether uid may renew or release tk.
func (tk *token) mine(uid uint32) bool { return uid == 0 || uid == tk.uid }

// renew extends the token if it is live, uid's, and names d in namespace
// ns, and reports whether it did. A lapsed token is released on the spot.
func (t *tokens) renew(id, ns string, d store.Digest, uid uint32) bool {
	now := t.clock.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	tk, ok := t.m[id]
	if !ok {
		return false
	}
	if !now.Before(tk.expires) {
		delete(t.m, id)
		t.dropLocked(tk.uid)
		tk.pin.Release()
		return false
	}
	if tk.pin.Digest() != d || tk.ns != ns || !tk.mine(uid) {
		return false
	}
	tk.expires = now.Add(t.ttl)
	return true
}

// release drops the token and its pin; false if there was no such token
// of uid's.
func (t *tokens) release(id string, uid uint32) bool {
	t.mu.Lock()
	tk, ok := t.m[id]
	ok = ok && tk.mine(uid)
	if ok {
		delete(t.m, id)
		t.dropLocked(tk.uid)
	}
	t.mu.Unlock()
	if ok {
		tk.pin.Release()
	}
	return ok
}

// expire releases every lapsed token and returns how many it released.
func (t *tokens) expire() int {
	now := t.clock.Now()
	var lapsed []*store.Pin
	t.mu.Lock()
	for id, tk := range t.m {
		if !now.Before(tk.expires) {
			delete(t.m, id)
			t.dropLocked(tk.uid)
			lapsed = append(lapsed, tk.pin)
		}
	}
	t.mu.Unlock()
	store.ReleaseAll(lapsed)
	return len(lapsed)
}

// len is the number of live tokens.
func (t *tokens) len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// close releases every token (the server mints no more: its handlers
// have ended).
func (t *tokens) close() {
	t.mu.Lock()
	m := t.m
	t.m = make(map[string]*token)
	t.per = make(map[uint32]int)
	t.mu.Unlock()
	for _, tk := range m {
		tk.pin.Release()
	}
}
