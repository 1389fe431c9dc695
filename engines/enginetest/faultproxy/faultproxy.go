// Package faultproxy is a TCP proxy a test controls, put between one
// client (a mount, a CLI) and a server (PostgreSQL) so that the test can
// cut that one client off while every other keeps its own path to the
// server. faultctl stops whole servers; a proxy cuts one host.
//
// A proxy is in one of three states:
//
//   - open: bytes flow both ways, as if the proxy were not there;
//   - reset ([Proxy.Reset]): every connection is closed with a TCP RST
//     on both sides, and new ones are accepted and reset at once — a host
//     whose network answers "no" (a firewall rejecting, a server that
//     went away);
//   - blackhole ([Proxy.Blackhole]): the client's connections stay open
//     and hear nothing more, and new ones are accepted (the kernel
//     completes the handshake) and hear nothing either — a host whose
//     packets just stop. The server's sides are closed, as a server's
//     keepalives close a peer that has gone silent, so the server drops
//     the client's sessions, transactions and locks.
//
// [Proxy.Restore] returns to open. Connections blackholed meanwhile are
// reset then (their server sides are gone, as after a real partition
// heals: the first packet gets an RST); new ones flow.
package faultproxy

import (
	"io"
	"net"
	"net/url"
	"sync"
	"testing"
)

// State is what a proxy does with traffic.
type State int

const (
	Open State = iota
	Reset
	Blackhole
)

func (s State) String() string {
	switch s {
	case Open:
		return "open"
	case Reset:
		return "reset"
	case Blackhole:
		return "blackhole"
	}
	return "State(?)"
}

// Proxy forwards connections from its own loopback address to one target.
type Proxy struct {
	ln     net.Listener
	target string

	mu       sync.Mutex
	state    State
	pairs    map[*pair]struct{}
	held     map[net.Conn]struct{} // client sides blackholed
	accepted int
	closed   bool
	wg       sync.WaitGroup
}

// pair is one proxied connection.
type pair struct {
	client, server net.Conn
}

// New starts a proxy to target (host:port) on 127.0.0.1 and a free port,
// open. It closes, with every connection, when t ends.
func New(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("faultproxy: listen: %v", err)
	}
	p := &Proxy{ln: ln, target: target, pairs: map[*pair]struct{}{}, held: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// Addr is the proxy's host:port.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns rawURL (a postgres:// or similar URL) with its host:port
// replaced by the proxy's, so that a client given it goes through the
// proxy. rawURL must name p's target.
func (p *Proxy) URL(t testing.TB, rawURL string) string {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatalf("faultproxy: %v", err)
	}
	if u.Host != p.target {
		t.Fatalf("faultproxy: URL names %s, the proxy forwards to %s", u.Host, p.target)
	}
	u.Host = p.Addr()
	return u.String()
}

// State is the proxy's state.
func (p *Proxy) State() State {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state
}

// Accepted is how many connections the proxy has accepted so far.
func (p *Proxy) Accepted() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.accepted
}

// Reset closes every connection with an RST on both sides and resets the
// new ones until Restore.
func (p *Proxy) Reset() { p.set(Reset) }

// Blackhole silences every connection (the client's side stays open and
// hears nothing; the server's side is closed) and every new one until
// Restore.
func (p *Proxy) Blackhole() { p.set(Blackhole) }

// Restore opens the proxy again: connections held by a blackhole are
// reset, new ones flow.
func (p *Proxy) Restore() { p.set(Open) }

func (p *Proxy) set(s State) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.state = s
	switch s {
	case Reset:
		for pr := range p.pairs {
			abort(pr.client)
			abort(pr.server)
			delete(p.pairs, pr)
		}
		p.resetHeld()
	case Blackhole:
		for pr := range p.pairs {
			// Hold the client side first, so that the copy goroutine
			// that sees the server side close does not close it too.
			p.held[pr.client] = struct{}{}
			delete(p.pairs, pr)
			abort(pr.server)
		}
	case Open:
		p.resetHeld()
	}
}

func (p *Proxy) resetHeld() {
	for c := range p.held {
		abort(c)
		delete(p.held, c)
	}
}

// Close stops the proxy and closes every connection. Idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	p.ln.Close()
	for pr := range p.pairs {
		abort(pr.client)
		abort(pr.server)
	}
	p.resetHeld()
	p.mu.Unlock()
	p.wg.Wait()
}

// abort closes c with an RST rather than a FIN.
func abort(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		tc.SetLinger(0)
	}
	c.Close()
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // closed
		}
		p.mu.Lock()
		p.accepted++
		state := p.state
		switch state {
		case Reset:
			abort(c)
		case Blackhole:
			p.held[c] = struct{}{}
		}
		p.mu.Unlock()
		if state == Open {
			p.wg.Add(1)
			go p.forward(c)
		}
	}
}

// forward dials the target for client c and copies both ways until one
// side ends or the proxy changes state.
func (p *Proxy) forward(c net.Conn) {
	defer p.wg.Done()
	s, err := net.Dial("tcp", p.target)
	if err != nil {
		abort(c)
		return
	}
	pr := &pair{client: c, server: s}
	p.mu.Lock()
	if p.state != Open || p.closed {
		// Cut while dialing: treat the new pair as the state says.
		if p.state == Blackhole && !p.closed {
			p.held[c] = struct{}{}
		} else {
			abort(c)
		}
		p.mu.Unlock()
		abort(s)
		return
	}
	p.pairs[pr] = struct{}{}
	p.mu.Unlock()

	done := make(chan struct{}, 2)
	cp := func(dst, src net.Conn) {
		io.Copy(dst, src)
		done <- struct{}{}
	}
	go cp(s, c)
	go cp(c, s)
	<-done
	// One side ended, or the proxy took the pair (Reset aborted both
	// sides; Blackhole aborted the server's and holds the client's). A
	// pair still ours ends with a FIN to the client, as a clean close.
	p.mu.Lock()
	_, ours := p.pairs[pr]
	delete(p.pairs, pr)
	p.mu.Unlock()
	if ours {
		c.Close()
	}
	s.Close()
	<-done
}
