package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"syscall"
	"time"
)

// sdNotify sends state to the service manager (systemd's sd_notify
// protocol: one datagram to the socket NOTIFY_SOCKET names), so that a
// Type=notify unit is started once the mount serves. Without NOTIFY_SOCKET
// it does nothing; a failure is returned for the log, never fatal.
func sdNotify(state string) error {
	conn, err := notifyConn()
	if conn == nil || err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Write([]byte(state))
	return err
}

func notifyConn() (*net.UnixConn, error) {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil, nil
	}
	if path[0] == '@' { // an abstract socket
		path = "\x00" + path[1:]
	}
	return net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
}

// sdNotifyBarrier is sdNotify, then a wait, at most timeout, until the
// service manager has handled it (sd_notify_barrier(3): BARRIER=1 with
// the write end of a pipe, which the manager closes once it has read
// every message sent before). A daemon that takes over the mount sends
// MAINPID= this way before the old one exits: the manager must know the
// new main process before it sees the old one go, or it would take the
// exit for the service's.
func sdNotifyBarrier(state string, timeout time.Duration) error {
	conn, err := notifyConn()
	if conn == nil || err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		return err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return err
	}
	defer r.Close()
	raw, err := conn.SyscallConn()
	if err != nil {
		w.Close()
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		// sendmsg(2) on the connected socket: net's WriteMsgUnix takes
		// it for a WriteTo.
		serr = syscall.Sendmsg(int(fd), []byte("BARRIER=1"), syscall.UnixRights(int(w.Fd())), nil, 0)
	})
	w.Close()
	if err == nil {
		err = serr
	}
	if err != nil {
		return fmt.Errorf("barrier: %w", err)
	}
	r.SetReadDeadline(time.Now().Add(timeout))
	var b [1]byte
	if _, err := r.Read(b[:]); !errors.Is(err, io.EOF) {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("the service manager did not confirm within %s (BARRIER=1)", timeout)
		}
		return fmt.Errorf("barrier: %v", err)
	}
	return nil
}
