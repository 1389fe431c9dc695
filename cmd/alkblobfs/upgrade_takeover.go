package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/fusefs"
	"github.com/alkblobfs/alkblobfs/handover"
)

// takeover is the new process's side, from its environment: nil when
// this process was not started by an upgrade.
type takeover struct {
	conn   *net.UnixConn
	httpLn net.Listener
	ctlLn  *net.UnixListener
	hooks  hooks
	lines  *bufio.Reader
}

// takeoverChild reads the environment an upgrade gives its new process
// (and removes it, so that no child of this one inherits it).
func takeoverChild() (*takeover, error) {
	v := os.Getenv(envTakeoverFD)
	if v == "" {
		return nil, nil
	}
	file := func(name string) (*os.File, error) {
		s := os.Getenv(name)
		os.Unsetenv(name)
		if s == "" {
			return nil, nil
		}
		fd, err := strconv.Atoi(s)
		if err != nil || fd < 3 {
			return nil, fmt.Errorf("%s=%q: not a descriptor", name, s)
		}
		unix.CloseOnExec(fd)
		return os.NewFile(uintptr(fd), name), nil
	}
	t := &takeover{hooks: hooksFrom(os.Environ())}
	for _, kv := range testEnv(os.Environ()) {
		k, _, _ := strings.Cut(kv, "=")
		os.Unsetenv(k)
	}
	f, err := file(envTakeoverFD)
	if err != nil {
		return nil, err
	}
	fc, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("the handover's socket: %w", err)
	}
	t.conn = fc.(*net.UnixConn)
	t.lines = bufio.NewReader(t.conn)
	return t, nil
}

// step is a test hook: the takeover dies here (SIGKILL, as a crash)
// when envTestDieAt names the step, or blocks for good (a hang) when
// envTestHangAt does.
func (t *takeover) step(n int) {
	if t == nil {
		return
	}
	if t.hooks.dieAt == n {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
	if t.hooks.hangAt == n {
		select {}
	}
}

// pendCarried records the carried files' pending links under this
// process's lease (fusefs.Server.PendCarried), or fails as the hooks say.
func (t *takeover) pendCarried(srv *fusefs.Server) error {
	if t.hooks.pendFail {
		return errors.New("test hook: the pending links could not be recorded")
	}
	return srv.PendCarried(context.Background())
}

func (t *takeover) say(line string) error {
	_, err := fmt.Fprintln(t.conn, line)
	return err
}

// run takes the mount over: hello, the handover, the restore with its
// pins, ready, and once the old daemon let go, serving. A failure before
// "go" is said to the old daemon, which serves on.
func (t *takeover) run(cfg fusefs.Config, lg *slog.Logger) (*fusefs.Server, error) {
	if err := t.say("hello"); err != nil {
		return nil, fmt.Errorf("takeover: %w", err)
	}
	t.step(stepHello)
	t.conn.SetReadDeadline(time.Now().Add(helloTimeout + stopTimeout + 10*time.Second))
	if err := t.receiveListeners(); err != nil {
		return nil, fmt.Errorf("takeover: %w", err)
	}
	fd, state, err := handover.Receive(t.conn, maxState)
	if err != nil {
		return nil, fmt.Errorf("takeover: %w", err)
	}
	files, err := receiveFiles(t.conn, fusefs.UploadsIn(state))
	if err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("takeover: %w", err)
	}
	t.step(stepReceived)
	srv, err := fusefs.TakeOver(fd, state, files, cfg)
	if err != nil {
		t.say("refused: " + strings.ReplaceAll(err.Error(), "\n", "; "))
		return nil, fmt.Errorf("takeover: %w", err)
	}
	t.step(stepRestored)
	if err := t.say("ready"); err != nil {
		srv.Abandon()
		return nil, fmt.Errorf("takeover: %w", err)
	}
	t.conn.SetReadDeadline(time.Now().Add(takeoverReadyTimeout + 10*time.Second))
	l, err := t.lines.ReadString('\n')
	if strings.TrimSpace(l) != "go" {
		srv.Abandon()
		return nil, fmt.Errorf("takeover: the old daemon did not say go (%q, %v); it serves on", strings.TrimSpace(l), err)
	}
	t.step(stepGo)
	if err := t.pendCarried(srv); err != nil {
		// Said before serving: the old daemon serves on with the files
		// of incoming/ it carried, as after a refusal before "go" (a
		// silent exit would make it fail them: this process might have
		// answered writes).
		srv.Abandon()
		t.say("refused: " + strings.ReplaceAll(err.Error(), "\n", "; "))
		return nil, fmt.Errorf("takeover: %w", err)
	}
	srv.Serve()
	t.step(stepServes)
	// The service manager's main process is this one from now on (the
	// old one exits once it hears "serving"): NotifyAccess=all lets it.
	if err := sdNotifyBarrier(fmt.Sprintf("MAINPID=%d\nREADY=1\nSTATUS=serving %s", os.Getpid(), srv.Dir()), 5*time.Second); err != nil {
		lg.Warn("could not tell the service manager that this process serves the mount now", "err", err)
	}
	if err := t.say(fmt.Sprintf("serving %d", os.Getpid())); err != nil {
		lg.Warn("could not tell the old daemon that the mount is served", "err", err)
	}
	t.conn.Close()
	return srv, nil
}

// http is the --listen socket passed on, if any.
func (t *takeover) http() net.Listener {
	if t == nil || t.httpLn == nil {
		return nil
	}
	return t.httpLn
}

// ctl is the control socket passed on, if any.
func (t *takeover) ctl() *net.UnixListener {
	if t == nil {
		return nil
	}
	return t.ctlLn
}

// Listening sockets pass by SCM_RIGHTS on the socket pair, one a
// message: a tag byte and the descriptor, then listenersEnd alone. Not
// as inherited descriptors (exec.Cmd.ExtraFiles): os/exec puts each
// into blocking mode, and the mode belongs to the socket, shared with
// this daemon's listener, whose Accept would then block in the kernel
// and its Close wait for the next connection.
const (
	listenerHTTP = 'H'
	listenerCtl  = 'C'
	uploadFile   = 'U' // after the handover: an upload's content (sendFiles)
	listenersEnd = '.'
)

// sendFiles passes the uploads' descriptors after the handover, one a
// message (uploadFile and the descriptor): as many as the state says
// (fusefs.UploadsIn), so that a predecessor of a build that passes none
// sends nothing more.
func sendFiles(conn *net.UnixConn, files []*os.File) error {
	for _, f := range files {
		if _, _, err := conn.WriteMsgUnix([]byte{uploadFile}, syscall.UnixRights(int(f.Fd())), nil); err != nil {
			return fmt.Errorf("pass on an upload: %w", err)
		}
	}
	return nil
}

// receiveFiles is sendFiles' other side, for n descriptors.
func receiveFiles(conn *net.UnixConn, n int) ([]*os.File, error) {
	var files []*os.File
	fail := func(err error) ([]*os.File, error) {
		for _, f := range files {
			f.Close()
		}
		return nil, fmt.Errorf("receive the uploads: %w", err)
	}
	for range n {
		tag, fd, err := receiveOne(conn)
		if err != nil {
			return fail(err)
		}
		if tag != uploadFile {
			if fd >= 0 {
				syscall.Close(fd)
			}
			return fail(fmt.Errorf("a message tagged %q", tag))
		}
		files = append(files, os.NewFile(uintptr(fd), "upload"))
	}
	return files, nil
}

// receiveOne reads one message of a tag byte with one descriptor, or the
// end (listenersEnd, with none).
func receiveOne(conn *net.UnixConn) (byte, int, error) {
	var b [1]byte
	oob := make([]byte, syscall.CmsgSpace(4*4))
	n, oobn, _, _, err := conn.ReadMsgUnix(b[:], oob)
	if err != nil {
		return 0, -1, err
	}
	var fds []int
	if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
		for i := range msgs {
			got, _ := syscall.ParseUnixRights(&msgs[i])
			fds = append(fds, got...)
		}
	}
	if n == 1 && b[0] == listenersEnd && len(fds) == 0 {
		return listenersEnd, -1, nil
	}
	if n != 1 || len(fds) != 1 {
		for _, fd := range fds {
			syscall.Close(fd)
		}
		return 0, -1, fmt.Errorf("a message of %d bytes (%q) with %d descriptors", n, b[:n], len(fds))
	}
	unix.CloseOnExec(fds[0])
	return b[0], fds[0], nil
}

// passListeners sends the control socket and --listen's.
func (c *controlServer) passListeners(conn *net.UnixConn) error {
	send := func(tag byte, ln any) error {
		sc, ok := ln.(syscall.Conn)
		if !ok {
			return fmt.Errorf("a %T has no descriptor", ln)
		}
		raw, err := sc.SyscallConn()
		if err != nil {
			return err
		}
		var werr error
		if err := raw.Control(func(fd uintptr) {
			_, _, werr = conn.WriteMsgUnix([]byte{tag}, syscall.UnixRights(int(fd)), nil)
		}); err != nil {
			return err
		}
		return werr
	}
	if c.httpLn != nil {
		if err := send(listenerHTTP, c.httpLn); err != nil {
			return fmt.Errorf("--listen socket: %w", err)
		}
	}
	if err := send(listenerCtl, c.ln); err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	_, err := conn.Write([]byte{listenersEnd})
	return err
}

// receiveListeners is passListeners' other side.
func (t *takeover) receiveListeners() error {
	for {
		var b [1]byte
		oob := make([]byte, syscall.CmsgSpace(4*4))
		n, oobn, _, _, err := t.conn.ReadMsgUnix(b[:], oob)
		if err != nil {
			return fmt.Errorf("receive the listening sockets: %w", err)
		}
		var fds []int
		if msgs, err := syscall.ParseSocketControlMessage(oob[:oobn]); err == nil {
			for i := range msgs {
				got, _ := syscall.ParseUnixRights(&msgs[i])
				fds = append(fds, got...)
			}
		}
		if n == 1 && b[0] == listenersEnd && len(fds) == 0 {
			return nil
		}
		if n != 1 || len(fds) != 1 || b[0] != listenerHTTP && b[0] != listenerCtl {
			for _, fd := range fds {
				syscall.Close(fd)
			}
			return fmt.Errorf("receive the listening sockets: a message of %d bytes (%q) with %d descriptors", n, b[:n], len(fds))
		}
		unix.CloseOnExec(fds[0])
		f := os.NewFile(uintptr(fds[0]), "listener")
		ln, err := net.FileListener(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("a listening socket passed on: %w", err)
		}
		if b[0] == listenerHTTP {
			if u, ok := ln.(*net.UnixListener); ok {
				u.SetUnlinkOnClose(true) // ours now, as if we had made it
			}
			t.httpLn = ln
		} else if u, ok := ln.(*net.UnixListener); ok {
			t.ctlLn = u
		} else {
			ln.Close()
			return errors.New("the control socket passed on is not a Unix socket")
		}
	}
}
