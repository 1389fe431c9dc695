package main

import (
	"net"
	"os"
)

// sdNotify sends state to the service manager (systemd's sd_notify
// protocol: one datagram to the socket NOTIFY_SOCKET names), so that a
// Type=notify unit is started once the mount serves. Without NOTIFY_SOCKET
// it does nothing; a failure is returned for the log, never fatal.
func sdNotify(state string) error {
	path := os.Getenv("NOTIFY_SOCKET")
	if path == "" {
		return nil
	}
	if path[0] == '@' { // an abstract socket
		path = "\x00" + path[1:]
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: path, Net: "unixgram"})
	if err != nil {
		return err
	}
	defer conn.Close()
	_, err = conn.Write([]byte(state))
	return err
}
