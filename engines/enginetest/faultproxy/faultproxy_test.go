package faultproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/alkblobfs/alkblobfs/engines/enginetest/faultproxy"
)

// echoServer answers every line with the same line, and reports on ended
// each connection it saw end (EOF or error).
func echoServer(t *testing.T) (addr string, ended <-chan struct{}) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	ch := make(chan struct{}, 16)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
				ch <- struct{}{}
			}()
		}
	}()
	return ln.Addr().String(), ch
}

func dial(t *testing.T, p *faultproxy.Proxy) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip sends a line and reads it back within d.
func roundTrip(c net.Conn, d time.Duration) error {
	c.SetDeadline(time.Now().Add(d))
	defer c.SetDeadline(time.Time{})
	if _, err := io.WriteString(c, "ping\n"); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err == nil && line != "ping\n" {
		return errors.New("echo sent " + line)
	}
	return err
}

func waitEnded(t *testing.T, ended <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatalf("the server never saw %s end", what)
	}
}

// TestReset: a reset proxy ends every connection with an RST at once, and
// resets new ones, until restored; other proxies to the same server are
// untouched.
func TestReset(t *testing.T) {
	addr, ended := echoServer(t)
	p, other := faultproxy.New(t, addr), faultproxy.New(t, addr)
	c, o := dial(t, p), dial(t, other)
	if err := roundTrip(c, 5*time.Second); err != nil {
		t.Fatalf("through an open proxy: %v", err)
	}
	p.Reset()
	if err := roundTrip(c, 5*time.Second); !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, io.EOF) && !errors.Is(err, syscall.EPIPE) {
		t.Fatalf("a reset connection answered %v; want ECONNRESET", err)
	}
	waitEnded(t, ended, "the reset connection")
	// A new connection is reset: at the dial or at its first round trip.
	n, err := net.DialTimeout("tcp", p.Addr(), 5*time.Second)
	if err == nil {
		err = roundTrip(n, 5*time.Second)
		n.Close()
	}
	if err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a new connection through a reset proxy answered %v; want it reset", err)
	}
	if err := roundTrip(o, 5*time.Second); err != nil {
		t.Fatalf("another proxy's connection, while this one is reset: %v", err)
	}
	p.Restore()
	if err := roundTrip(dial(t, p), 5*time.Second); err != nil {
		t.Fatalf("after Restore: %v", err)
	}
}

// TestBlackhole: a blackholed connection stays open and hears nothing (a
// read times out rather than failing), the server sees its side end, new
// connections are accepted and hear nothing; Restore resets the held
// ones and lets new ones through.
func TestBlackhole(t *testing.T) {
	addr, ended := echoServer(t)
	p := faultproxy.New(t, addr)
	c := dial(t, p)
	if err := roundTrip(c, 5*time.Second); err != nil {
		t.Fatalf("through an open proxy: %v", err)
	}
	p.Blackhole()
	waitEnded(t, ended, "the blackholed connection's server side")
	if err := roundTrip(c, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a blackholed connection answered %v; want silence (a timeout)", err)
	}
	n := dial(t, p) // accepted: the handshake is the kernel's
	if err := roundTrip(n, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a new connection through a blackhole answered %v; want silence", err)
	}
	p.Restore()
	if err := roundTrip(c, 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("a held connection after Restore answered %v; want it reset", err)
	}
	if err := roundTrip(dial(t, p), 5*time.Second); err != nil {
		t.Fatalf("a new connection after Restore: %v", err)
	}
}
