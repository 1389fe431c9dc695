//go:build unix

package postgres

import (
	"crypto/tls"
	"syscall"

	"github.com/jackc/pgx/v5"
	"golang.org/x/sys/unix"
)

// peerSpoke reports whether the server has written to an idle connection
// (or closed it): one non-blocking MSG_PEEK, no bytes consumed. An idle
// connection owes us nothing, so anything there — typically "terminating
// connection" and EOF after a restart — means it must be checked before use.
func peerSpoke(c *pgx.Conn) bool {
	nc := c.PgConn().Conn()
	if t, ok := nc.(*tls.Conn); ok {
		nc = t.NetConn()
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	spoke := false
	var b [1]byte
	// Control, not Read: RawConn.Read waits for the descriptor's read lock,
	// which pgconn's background reader may hold, blocked in a read that
	// only ends when the server writes. Control only pins the descriptor.
	err = rc.Control(func(fd uintptr) {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		switch {
		case err == unix.EAGAIN || err == unix.EWOULDBLOCK || err == unix.EINTR:
		case err != nil, n >= 0: // data, EOF (n == 0) or a socket error
			spoke = true
		}
	})
	return spoke || err != nil
}
