package ops

import (
	"net"

	"golang.org/x/sys/unix"
)

// peerCred is the uid and gid of a Unix socket connection's peer, as the
// kernel recorded them when it connected (SO_PEERCRED); ok is false for a
// connection that is not a Unix socket's.
func peerCred(c net.Conn) (uid, gid uint32, ok bool, err error) {
	uc, isUnix := c.(*net.UnixConn)
	if !isUnix {
		return 0, 0, false, nil
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return 0, 0, true, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) {
		cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return 0, 0, true, err
	}
	if serr != nil {
		return 0, 0, true, serr
	}
	return cred.Uid, cred.Gid, true, nil
}
