//go:build !linux

package ops

import (
	"errors"
	"net"
)

// peerCred: only Linux is supported; a Unix socket's peer is refused.
func peerCred(c net.Conn) (uid, gid uint32, ok bool, err error) {
	if _, isUnix := c.(*net.UnixConn); !isUnix {
		return 0, 0, false, nil
	}
	return 0, 0, true, errors.New("peer credentials are read on Linux only")
}
