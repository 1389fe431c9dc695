package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/fusefs"
	"github.com/alkblobfs/alkblobfs/handover"
	"github.com/alkblobfs/alkblobfs/rundir"
)

// Upgrade without unmounting (issue 37; fusefs/handover.go has what
// carries across). `alkblobfs upgrade MNT` asks the daemon serving MNT,
// on its control socket (fusefs.ControlSocket), to hand the mount over.
// The daemon starts the new binary with its own command line and
// environment, plus envTakeoverFD naming one end of a socket pair (and
// the listeners it passes on), and they talk over it in lines:
//
//	new → old  hello             the store is open (the mount still serves)
//	old → new  the listeners     the control socket and --listen's (passListeners)
//	old → new  the handover      package handover: /dev/fuse and the state
//	new → old  ready | refused: why
//	old → new  go                serve (the old server, stopped, keeps its pins)
//	new → old  serving PID | refused: why (before it serves)
//	old        lets go: detaches, drops its pins, exits
//
// Before "serving" anything that fails (the binary missing, a crash, a
// refusal, a time-out) leaves the old daemon serving: it kills the new
// process, waits until it is gone, and resumes; the kernel resends what
// the new one read and did not answer. The new process takes its pins
// before "ready" and the old one drops its own after "serving", so no
// blob open through the mount is unpinned for an instant.

// errRefused: the new daemon said "refused: why" (before it serves).
var errRefused = errors.New("the new daemon refused")

// Environment of the process an upgrade starts.
const envTakeoverFD = "ALKBLOBFS_TAKEOVER_FD" // the socket pair

// Test hooks: variables that break or slow an upgrade at a chosen step,
// read only by a build with the tag alkblobfs_testhooks (testHooks: the
// tests build the binary so in TestMain). Such a build passes the
// variables of the upgrade command's own environment to the daemon, and
// from it to the new process.
const (
	envTestPrefix = "ALKBLOBFS_TEST_"
	// envTestDieAt makes the new process kill itself (SIGKILL) at that
	// step of the takeover (takeoverStep), envTestHangAt block there.
	envTestDieAt  = envTestPrefix + "TAKEOVER_DIE_AT"
	envTestHangAt = envTestPrefix + "TAKEOVER_HANG_AT"
	// envTestStateVersion makes the old daemon label its state with this
	// format version, to test the refusal of a newer one.
	envTestStateVersion = envTestPrefix + "HANDOVER_VERSION"
	// envTestServingTimeout is how long the old daemon waits for
	// "serving" (a Go duration) instead of servingTimeout.
	envTestServingTimeout = envTestPrefix + "SERVING_TIMEOUT"
	// envTestPendFail (any value) makes the new process fail to record
	// the carried files' pending links once told to serve.
	envTestPendFail = envTestPrefix + "PEND_FAIL"
)

// hooks are the test hooks set in an environment.
type hooks struct {
	dieAt, hangAt  int
	stateVersion   int
	servingTimeout time.Duration
	pendFail       bool
}

// hooksFrom reads the hooks of env: none in a production build.
func hooksFrom(env []string) hooks {
	h := hooks{stateVersion: fusefs.HandoverVersion, servingTimeout: servingTimeout}
	if !testHooks {
		return h
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		n, _ := strconv.Atoi(v)
		switch k {
		case envTestDieAt:
			h.dieAt = n
		case envTestHangAt:
			h.hangAt = n
		case envTestStateVersion:
			h.stateVersion = n
		case envTestServingTimeout:
			if d, err := time.ParseDuration(v); err == nil {
				h.servingTimeout = d
			}
		case envTestPendFail:
			h.pendFail = true
		}
	}
	return h
}

// testEnv is the test hooks' variables of env, to pass on: none in a
// production build.
func testEnv(env []string) []string {
	if !testHooks {
		return nil
	}
	var out []string
	for _, kv := range env {
		if strings.HasPrefix(kv, envTestPrefix) {
			out = append(out, kv)
		}
	}
	return out
}

// Steps of the takeover at which the hooks kill or stop the new process.
const (
	stepStarted  = 1 // before it opens the store
	stepHello    = 2 // store open, said hello; before the handover arrives
	stepReceived = 3 // the descriptor and state received; before the restore
	stepRestored = 4 // nodes restored and pins taken; before "ready"
	stepGo       = 5 // told to serve; before it serves
	stepServes   = 6 // serving; before it says so
)

// Bounds of an upgrade's waits.
const (
	helloTimeout         = 2 * time.Minute // the new process opens the store (the mount still serves)
	stopTimeout          = 10 * time.Second
	takeoverReadyTimeout = time.Minute // restore and pins (the mount is paused)
	letGoTimeout         = 30 * time.Second
	servingTimeout       = 30 * time.Second
	upgradeTimeout       = helloTimeout + stopTimeout + takeoverReadyTimeout + letGoTimeout + servingTimeout + 30*time.Second
	maxState             = 256 << 20
)

// upgradeRequest is what `alkblobfs upgrade` sends the daemon.
type upgradeRequest struct {
	Op     string   `json:"op"` // "upgrade"
	Binary string   `json:"binary"`
	Env    []string `json:"env,omitempty"` // test hooks (testEnv)
}

// upgradeReply is one line of the daemon's answer: progress (Msg), then
// the end: OK with the new daemon's pid, or Error.
type upgradeReply struct {
	Msg   string `json:"msg,omitempty"`
	Error string `json:"error,omitempty"`
	OK    bool   `json:"ok,omitempty"`
	PID   int    `json:"pid,omitempty"`
	Pause string `json:"pause,omitempty"`
}

func newUpgradeCmd(a *app) *cobra.Command {
	var binary string
	cmd := &cobra.Command{
		Use:   "upgrade MOUNTPOINT",
		Short: "Hand a live mount to a new alkblobfs binary without unmounting",
		Long: `upgrade has the daemon serving MOUNTPOINT start a new alkblobfs (by default
the executable at this command's own path, read again from disk: the build
just installed) and hand it the live mount. Programs keep their open files,
their working directories and directory listings in progress, and new opens
work; a request made during the handover waits (tens of milliseconds) and
is answered by the new daemon.

The new daemon runs with the old one's command line and environment, takes
its own pin on every blob open through the mount before the old one lets
go, and keeps the old one's role: pid record, guard, --listen socket, sweep
timer, change feed, writer lease. Files being written into incoming/ carry
across: their writers go on, and their last close publishes; a version an
fsync committed stays pending throughout. upgrade prints what happened and
exits 0 once the new daemon serves.

If the new binary is missing, crashes, refuses the state, or does not say
it serves within 30 s, the old daemon kills it and serves on as if nothing
happened, and upgrade exits 1 with the reason. Refused, the same way: while
a put by path is in progress or a file's upload failed (named; retry when
they close), a state format newer than the new build reads, and an option
fixed when the mount was made that the new build would set otherwise
(named).

Not carried across: receipts not open, and directories and links made in
incoming/: their names are gone as after a restart (a file being written
in such a directory goes on without its name), and a program inside such a
directory gets ESTALE. Only root and the mount's owner may upgrade it.`,
		Example: `  alkblobfs upgrade /mnt/blobs
  alkblobfs upgrade --binary /usr/local/bin/alkblobfs.new /mnt/blobs`,
		Args: argsRange(1, 1, "MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if binary == "" {
				exe, err := os.Executable()
				if err != nil {
					return fmt.Errorf("find this program (give --binary): %w", err)
				}
				binary = exe
			}
			abs, err := filepath.Abs(binary)
			if err != nil {
				return err
			}
			if err := checkExecutable(abs); err != nil {
				return err
			}
			return runUpgrade(cmd.Context(), a.stdout, args[0], abs)
		},
	}
	cmd.Flags().StringVar(&binary, "binary", "", "the `PATH` of the new alkblobfs (default: this command's executable, read again from disk)")
	return cmd
}

// checkExecutable refuses a binary the daemon could not start, before
// anything stops.
func checkExecutable(path string) error {
	fi, err := os.Stat(path)
	switch {
	case err != nil:
		return fmt.Errorf("new binary: %w", err)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("new binary %s: not a regular file", path)
	case fi.Mode().Perm()&0o111 == 0:
		return fmt.Errorf("new binary %s: not executable", path)
	}
	return nil
}

// runUpgrade is the upgrade command: it asks the daemon of mnt and
// prints its progress to out.
func runUpgrade(ctx context.Context, out io.Writer, mnt, binary string) error {
	abs, err := filepath.Abs(mnt)
	if err != nil {
		return err
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	sock := fusefs.ControlSocket(abs)
	if _, err := os.Lstat(sock); errors.Is(err, os.ErrNotExist) && os.Geteuid() != 0 {
		// Not this user's own mount: root's, whose socket is in the
		// system runtime directory (and refuses this user).
		if sys := filepath.Join(rundir.System, filepath.Base(sock)); sys != sock {
			if _, err := os.Lstat(sys); err == nil {
				sock = sys
			}
		}
	}
	c, err := net.DialTimeout("unix", sock, 5*time.Second)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ECONNREFUSED) {
			return fmt.Errorf("%s: no alkblobfs daemon that can upgrade serves it (no control socket %s): is it mounted, by a build with upgrade?", abs, sock)
		}
		return fmt.Errorf("%s: reach its daemon: %w", abs, err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(upgradeTimeout))
	req := upgradeRequest{Op: "upgrade", Binary: binary, Env: testEnv(os.Environ())}
	if err := json.NewEncoder(c).Encode(req); err != nil {
		return fmt.Errorf("%s: send the request: %w", abs, err)
	}
	dec := json.NewDecoder(bufio.NewReader(c))
	for {
		var r upgradeReply
		if err := dec.Decode(&r); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("upgrade %s: the daemon closed the connection without an answer (see its log)", abs)
			}
			return fmt.Errorf("upgrade %s: %w", abs, err)
		}
		switch {
		case r.Error != "":
			return fmt.Errorf("upgrade %s: %s", abs, r.Error)
		case r.OK:
			fmt.Fprintf(out, "upgraded %s: pid %d serves it (requests paused %s)\n", abs, r.PID, r.Pause)
			return nil
		case r.Msg != "":
			fmt.Fprintln(out, r.Msg)
		}
		if ctx.Err() != nil {
			// The daemon goes on: an upgrade in progress is not stopped
			// half way by a client that leaves.
			return fmt.Errorf("upgrade %s: interrupted; the daemon finishes or abandons the upgrade by itself (see its log)", abs)
		}
	}
}

// controlServer is a daemon's control socket: it takes upgrade requests.
type controlServer struct {
	ln     *net.UnixListener
	srv    *fusefs.Server
	httpLn net.Listener // --listen's, passed on; nil without
	lg     *slog.Logger

	mu     sync.Mutex // one upgrade at a time
	wg     sync.WaitGroup
	closed chan struct{}
	// handedOver is closed once the mount went to a successor that
	// serves: the daemon then exits without unmounting.
	handedOver chan struct{}
	succeeded  sync.Once
}

// startControl listens on the mount's control socket (or takes the
// predecessor's, inherited) and serves upgrade requests until close.
func startControl(srv *fusefs.Server, inherited *net.UnixListener, httpLn net.Listener, lg *slog.Logger, restarted bool) (*controlServer, error) {
	ln := inherited
	if ln == nil {
		path := fusefs.ControlSocket(srv.Dir())
		// A socket left by a daemon that died: nothing answers it. One
		// this daemon was restarted after may still accept (a dying
		// process's descriptors, while it waits on the mount): taken
		// over.
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil && !restarted {
			c.Close()
			return nil, fmt.Errorf("control socket %s: another daemon answers there", path)
		} else if err == nil {
			c.Close()
		}
		os.Remove(path)
		l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
		if err != nil {
			return nil, fmt.Errorf("control socket: %w", err)
		}
		// Root and the owner. (Not by the umask, which is the whole
		// process's: files made meanwhile would take it.) Until the
		// chmod, handle refuses any other user all the same.
		if err := os.Chmod(path, 0o600); err != nil {
			l.Close()
			return nil, fmt.Errorf("control socket: %w", err)
		}
		ln = l
	}
	ln.SetUnlinkOnClose(true)
	c := &controlServer{ln: ln, srv: srv, httpLn: httpLn, lg: lg, closed: make(chan struct{}), handedOver: make(chan struct{})}
	c.wg.Add(1)
	go c.serve()
	return c, nil
}

// close stops taking requests and waits for the one under way. After a
// handover the socket stays, the successor's.
func (c *controlServer) close(handedOver bool) {
	if c == nil {
		return
	}
	if handedOver {
		c.ln.SetUnlinkOnClose(false)
	}
	select {
	case <-c.closed:
	default:
		close(c.closed)
	}
	c.ln.Close()
	c.wg.Wait()
}

func (c *controlServer) serve() {
	defer c.wg.Done()
	for {
		conn, err := c.ln.AcceptUnix()
		if err != nil {
			select {
			case <-c.closed:
				return
			default:
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			c.lg.Warn("control socket", "err", err)
			time.Sleep(100 * time.Millisecond) // not a busy loop on a persistent error (EMFILE)
			continue
		}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			c.handle(conn)
		}()
	}
}

// handle answers one connection: root and the daemon's own user only.
func (c *controlServer) handle(conn *net.UnixConn) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(upgradeTimeout))
	enc := json.NewEncoder(conn)
	if uid, err := peerUID(conn); err != nil || uid != 0 && uid != os.Geteuid() {
		enc.Encode(upgradeReply{Error: fmt.Sprintf("permission denied: only root and the mount's owner (uid %d) may upgrade it", os.Geteuid())})
		return
	}
	var req upgradeRequest
	if err := json.NewDecoder(conn).Decode(&req); err != nil || req.Op != "upgrade" {
		enc.Encode(upgradeReply{Error: fmt.Sprintf("bad request (%v)", err)})
		return
	}
	if !c.mu.TryLock() {
		enc.Encode(upgradeReply{Error: "an upgrade of this mount is under way already"})
		return
	}
	defer c.mu.Unlock()
	select {
	case <-c.handedOver:
		enc.Encode(upgradeReply{Error: "this daemon has handed the mount over already"})
		return
	default:
	}
	say := func(format string, args ...any) {
		msg := fmt.Sprintf(format, args...)
		c.lg.Info("upgrade: " + msg)
		enc.Encode(upgradeReply{Msg: msg})
	}
	pid, pause, err := c.upgrade(req, say)
	if err != nil {
		c.lg.Warn("upgrade failed; serving on", "err", err)
		enc.Encode(upgradeReply{Error: err.Error()})
		return
	}
	enc.Encode(upgradeReply{OK: true, PID: pid, Pause: pause.Round(time.Millisecond).String()})
	c.succeeded.Do(func() { close(c.handedOver) })
}

func peerUID(conn *net.UnixConn) (int, error) {
	raw, err := conn.SyscallConn()
	if err != nil {
		return -1, err
	}
	var cred *unix.Ucred
	var cerr error
	if err := raw.Control(func(fd uintptr) {
		cred, cerr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	}); err != nil {
		return -1, err
	}
	if cerr != nil {
		return -1, cerr
	}
	return int(cred.Uid), nil
}

// successor is the old daemon's view of the new process.
type successor struct {
	cmd    *exec.Cmd
	conn   *net.UnixConn
	lines  chan string // what it says, line by line; closed at EOF
	exited chan struct{}
	status error
}

// killTimeout bounds the wait for a killed successor to be gone.
const killTimeout = 10 * time.Second

// kill stops a successor that has not taken over, and reaps it. It
// reports whether the successor is gone: one that is not may still read
// from the mount's connection, so the old daemon must not serve beside it.
// The socket pair closes after the kill: a successor that sees it close
// takes the old daemon for gone.
func (s *successor) kill() bool {
	s.cmd.Process.Kill()
	defer s.conn.Close()
	select {
	case <-s.exited:
		return true
	case <-time.After(killTimeout):
		return false
	}
}

// expect waits for a line starting with want, at most within.
func (s *successor) expect(want string, within time.Duration) (string, error) {
	select {
	case l, ok := <-s.lines:
		if !ok {
			// Its end closed: it exited, or is about to.
			select {
			case <-s.exited:
				return "", fmt.Errorf("the new daemon (pid %d) exited (%v) before it said %q; see the log", s.cmd.Process.Pid, s.status, want)
			case <-time.After(5 * time.Second):
				return "", fmt.Errorf("the new daemon (pid %d) closed the handover's socket before it said %q", s.cmd.Process.Pid, want)
			}
		}
		if r, ok := strings.CutPrefix(l, "refused: "); ok {
			return "", fmt.Errorf("%w: %s", errRefused, r)
		}
		if !strings.HasPrefix(l, want) {
			return "", fmt.Errorf("the new daemon said %q, want %q", l, want)
		}
		return l, nil
	case <-time.After(within):
		return "", fmt.Errorf("the new daemon (pid %d) did not say %q within %s", s.cmd.Process.Pid, want, within)
	}
}

// startSuccessor starts binary as this daemon's successor.
// hookEnv is the request's test hooks (testEnv), passed on.
func (c *controlServer) startSuccessor(binary string, hookEnv []string) (*successor, error) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	ours := os.NewFile(uintptr(fds[0]), "handover")
	theirs := os.NewFile(uintptr(fds[1]), "handover")
	defer theirs.Close()
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		return nil, err
	}
	conn := fc.(*net.UnixConn)
	files := []*os.File{theirs}
	env := append(append(os.Environ(), envTakeoverFD+"=3"), testEnv(hookEnv)...)
	cmd := &exec.Cmd{
		Path:       binary,
		Args:       append([]string{os.Args[0]}, os.Args[1:]...),
		Env:        env,
		Stdin:      os.Stdin,
		Stdout:     os.Stdout,
		Stderr:     os.Stderr,
		ExtraFiles: files,
		// A daemon of its own: it outlives this one.
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		conn.Close()
		return nil, fmt.Errorf("start %s: %w", binary, err)
	}
	s := &successor{cmd: cmd, conn: conn, lines: make(chan string, 4), exited: make(chan struct{})}
	go func() {
		s.status = cmd.Wait()
		close(s.exited)
	}()
	go func() {
		defer close(s.lines)
		sc := bufio.NewScanner(conn)
		for sc.Scan() {
			s.lines <- sc.Text()
		}
	}()
	return s, nil
}

// upgrade hands the mount to binary; on an error the mount serves on
// here (unless the error says otherwise).
func (c *controlServer) upgrade(req upgradeRequest, say func(string, ...any)) (int, time.Duration, error) {
	if err := c.srv.CheckHandover(); err != nil {
		return 0, 0, err
	}
	if err := checkExecutable(req.Binary); err != nil {
		return 0, 0, err
	}
	hk := hooksFrom(req.Env)
	s, err := c.startSuccessor(req.Binary, req.Env)
	if err != nil {
		return 0, 0, fmt.Errorf("%w; the old daemon serves on", err)
	}
	say("started %s (pid %d)", req.Binary, s.cmd.Process.Pid)
	if _, err := s.expect("hello", helloTimeout); err != nil {
		s.kill()
		return 0, 0, fmt.Errorf("%w; the old daemon serves on", err)
	}
	if err := c.passListeners(s.conn); err != nil {
		s.kill()
		return 0, 0, fmt.Errorf("pass on the listening sockets: %w; the old daemon serves on", err)
	}
	say("the new daemon opened the store; pausing the mount")
	start := time.Now()
	h, err := c.srv.BeginHandover(stopTimeout, hk.stateVersion)
	if err != nil {
		s.kill()
		return 0, 0, fmt.Errorf("%w; the old daemon serves on", err)
	}
	// From here every failure before "serving" kills the successor and,
	// once it is gone, resumes.
	told := false // "go" sent: the successor may have served and told the service manager
	resume := func(err error) (int, time.Duration, error) {
		if !s.kill() {
			return 0, 0, fmt.Errorf("%w; and the new daemon (pid %d) did not exit within %s of SIGKILL: the mount is left stopped (umount --force, then mount)", err, s.cmd.Process.Pid, killTimeout)
		}
		if rerr := h.Resume(); rerr != nil {
			return 0, 0, fmt.Errorf("%w; and resuming failed: %v", err, rerr)
		}
		if told {
			if nerr := sdNotify(fmt.Sprintf("MAINPID=%d\nREADY=1\nSTATUS=serving %s", os.Getpid(), c.srv.Dir())); nerr != nil {
				c.lg.Warn("could not tell the service manager that this process serves the mount again", "err", nerr)
			}
		}
		return 0, 0, fmt.Errorf("%w; the new daemon was killed and the old daemon serves on", err)
	}
	err = handover.Send(s.conn, h.FD(), h.State())
	if err == nil {
		err = sendFiles(s.conn, h.Files())
	}
	h.CloseFD()
	if err != nil {
		return resume(err)
	}
	if _, err := s.expect("ready", takeoverReadyTimeout); err != nil {
		return resume(err)
	}
	told = true
	h.Told()
	if _, err := fmt.Fprintln(s.conn, "go"); err != nil {
		return resume(fmt.Errorf("tell the new daemon (pid %d) to serve: %w", s.cmd.Process.Pid, err))
	}
	l, err := s.expect("serving", hk.servingTimeout)
	if errors.Is(err, errRefused) {
		// It refuses only before it serves: it answered nothing, told
		// nobody, and the files it took go on here unharmed.
		told = false
		h.Refused()
	}
	if err != nil {
		return resume(err)
	}
	pause := time.Since(start)
	h.Commit(letGoTimeout)
	// The new daemon's process is waited for by startSuccessor's
	// goroutine until this one exits (never released, which would race
	// that Wait).
	s.conn.Close()
	pid, _ := strconv.Atoi(strings.TrimSpace(strings.TrimPrefix(l, "serving")))
	return pid, pause, nil
}
