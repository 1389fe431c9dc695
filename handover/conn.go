package handover

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// magic opens every message, so that a peer speaking something else is
// refused rather than misread.
var magic = [4]byte{'A', 'F', 'H', '1'}

const headerLen = len(magic) + 8 // magic, big-endian state length

// ErrProtocol is what Receive wraps when the peer's message is not a
// handover: no magic, no descriptor or several, a descriptor that is not
// /dev/fuse, a state too large.
var ErrProtocol = errors.New("not a handover message")

// Send writes fd (as SCM_RIGHTS, on the header's bytes) and state to c.
// fd stays open in the caller: the peer receives a new descriptor for
// the same open file description.
func Send(c *net.UnixConn, fd int, state []byte) error {
	var hdr [headerLen]byte
	copy(hdr[:], magic[:])
	binary.BigEndian.PutUint64(hdr[len(magic):], uint64(len(state)))
	n, oobn, err := c.WriteMsgUnix(hdr[:], syscall.UnixRights(fd), nil)
	if err != nil {
		return fmt.Errorf("handover: send descriptor: %w", err)
	}
	if n != len(hdr) || oobn != len(syscall.UnixRights(fd)) {
		return fmt.Errorf("handover: send descriptor: short write (%d of %d bytes, %d of %d control)", n, len(hdr), oobn, len(syscall.UnixRights(fd)))
	}
	if _, err := c.Write(state); err != nil {
		return fmt.Errorf("handover: send %d bytes of state: %w", len(state), err)
	}
	return nil
}

// Receive reads one message of Send's from c: the descriptor, which the
// caller then owns, and the state, refused past maxState bytes.
func Receive(c *net.UnixConn, maxState int) (fd int, state []byte, err error) {
	var hdr [headerLen]byte
	oob := make([]byte, syscall.CmsgSpace(4*4)) // room to see a peer that sends several
	n, oobn, flags, _, err := c.ReadMsgUnix(hdr[:], oob)
	if err != nil {
		return -1, nil, fmt.Errorf("handover: receive descriptor: %w", err)
	}
	fd, err = parseRights(oob[:oobn])
	if flags&syscall.MSG_CTRUNC != 0 {
		// The kernel dropped descriptors that did not fit: the
		// message is not one of Send's, whatever arrived.
		if err == nil {
			syscall.Close(fd)
		}
		return -1, nil, fmt.Errorf("handover: receive: %w: control data truncated (more descriptors than one)", ErrProtocol)
	}
	if err != nil {
		return -1, nil, err
	}
	// From here on a failure closes the descriptor it received.
	defer func() {
		if err != nil {
			syscall.Close(fd)
			fd = -1
		}
	}()
	if err := checkFuseDevice(fd); err != nil {
		return -1, nil, err
	}
	// A stream may deliver the header in pieces; the descriptor
	// came with the first.
	if _, err := io.ReadFull(c, hdr[n:]); err != nil {
		return -1, nil, fmt.Errorf("handover: receive header: %w", err)
	}
	if [4]byte(hdr[:len(magic)]) != magic {
		return -1, nil, fmt.Errorf("handover: receive: %w: magic %q", ErrProtocol, hdr[:len(magic)])
	}
	size := binary.BigEndian.Uint64(hdr[len(magic):])
	if size > uint64(maxState) {
		return -1, nil, fmt.Errorf("handover: receive: %w: state of %d bytes, more than %d", ErrProtocol, size, maxState)
	}
	state = make([]byte, size)
	if _, err := io.ReadFull(c, state); err != nil {
		return -1, nil, fmt.Errorf("handover: receive %d bytes of state: %w", size, err)
	}
	return fd, state, nil
}

// The FUSE device's numbers (Linux's Documentation/admin-guide/devices.txt:
// misc major 10, minor 229).
const (
	fuseMajor = 10
	fuseMinor = 229
)

// checkFuseDevice refuses a descriptor that is not /dev/fuse: serving
// some other file as a FUSE connection would write replies into it.
func checkFuseDevice(fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("handover: receive: fstat descriptor: %w", err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR || unix.Major(st.Rdev) != fuseMajor || unix.Minor(st.Rdev) != fuseMinor {
		return fmt.Errorf("handover: receive: %w: the descriptor is not /dev/fuse (mode %#o, device %d:%d)",
			ErrProtocol, st.Mode&unix.S_IFMT, unix.Major(st.Rdev), unix.Minor(st.Rdev))
	}
	return nil
}

// parseRights returns the one descriptor in the control messages oob,
// closing any others.
func parseRights(oob []byte) (int, error) {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return -1, fmt.Errorf("handover: receive: control message: %w", err)
	}
	var fds []int
	for i := range msgs {
		got, err := syscall.ParseUnixRights(&msgs[i])
		if err != nil {
			continue
		}
		fds = append(fds, got...)
	}
	if len(fds) == 1 {
		return fds[0], nil
	}
	for _, fd := range fds {
		syscall.Close(fd)
	}
	return -1, fmt.Errorf("handover: receive: %w: %d descriptors, want 1", ErrProtocol, len(fds))
}
