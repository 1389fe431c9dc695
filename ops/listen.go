package ops

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/alkblobfs/alkblobfs/rundir"
)

// ListenConfig says what a TCP listener may rely on to identify callers.
type ListenConfig struct {
	// Tokens: the server has a token file (Config.Tokens).
	Tokens bool
	// InsecureLoopback: a loopback address may go without one, and every
	// request without a token acts as the server's own user.
	InsecureLoopback bool
	// TakeOver: the Unix socket's server is known dead (a mount's daemon
	// restarted after a crash), though a descriptor of its may still
	// accept (a dying process not yet gone): its path is taken over.
	TakeOver bool
}

// ErrNeedsAuth: a TCP listener without a token file.
var ErrNeedsAuth = errors.New("a TCP listener needs a token file: give --auth-token-file FILE (one token per line: " + TokenFileFormat + ", mode 0600), or serve local users on a Unix socket (--listen unix:PATH, the default)")

// Listen opens addr for the server: "unix:PATH" is a Unix socket (see
// ListenUnix), anything else HOST:PORT over TCP. A TCP listener needs
// tokens, loopback included, unless InsecureLoopback is set for a
// loopback address: without them any local user could act as anyone.
func Listen(addr string, c ListenConfig) (net.Listener, error) {
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		return listenUnix(path, c.TakeOver)
	}
	if !c.Tokens && !c.InsecureLoopback {
		return nil, fmt.Errorf("listen %s: %w", addr, ErrNeedsAuth)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if !c.Tokens && !loopback(ln.Addr()) {
		ln.Close()
		return nil, fmt.Errorf("listen %s: --insecure-loopback serves loopback only (127.0.0.1, [::1]); another address: %w", addr, ErrNeedsAuth)
	}
	return ln, nil
}

func loopback(a net.Addr) bool {
	ta, ok := a.(*net.TCPAddr)
	return ok && ta.IP.IsLoopback()
}

// DefaultSocket is the Unix socket a server listens on when not told
// otherwise: $XDG_RUNTIME_DIR/alkblobfs/http.sock when the variable is
// set (a user's own server: that directory is the user's alone), else
// http.sock in the system runtime directory, /run/alkblobfs (a system
// service; rundir keeps that directory 0755 so that every local user
// reaches it, whether a mount or the server made it).
func DefaultSocket() string {
	if d := os.Getenv("XDG_RUNTIME_DIR"); d != "" {
		return filepath.Join(d, "alkblobfs", "http.sock")
	}
	return filepath.Join(rundir.System, "http.sock")
}

// ListenUnix listens on a Unix socket at path, mode 0666: any local user
// may connect, and each is then the user the kernel says it is
// (SO_PEERCRED), as for a file operation on the mount. The directory is
// made (0755) if absent; the default socket's is the runtime directory,
// which rundir.Make makes: /run/alkblobfs 0755 (and sets it back to
// 0755), a user's own 0700. A socket left by a server
// that is gone is replaced; one a live server answers on is an error.
func ListenUnix(path string) (net.Listener, error) { return listenUnix(path, false) }

// listenUnix is ListenUnix; with takeOver, a socket that answers is
// replaced as well (ListenConfig.TakeOver).
func listenUnix(path string, takeOver bool) (net.Listener, error) {
	if path == "" {
		return nil, errors.New("listen unix: give a path (unix:PATH)")
	}
	mkdir := func(dir string) error { return os.MkdirAll(dir, 0o755) }
	if path == DefaultSocket() {
		mkdir = rundir.Make // a directory of the user's own choice is left as it is
	}
	if err := mkdir(filepath.Dir(path)); err != nil {
		return nil, fmt.Errorf("listen unix:%s: %w", path, err)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("listen unix:%s: a file that is not a socket is there; remove it or give another path", path)
		}
		if !takeOver {
			c, err := net.DialTimeout("unix", path, time.Second)
			if err == nil {
				c.Close()
				return nil, fmt.Errorf("listen unix:%s: another server listens there (stop it, or give --listen unix:OTHER)", path)
			}
		}
		os.Remove(path) // a dead server's: nothing answers
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		return nil, fmt.Errorf("listen unix:%s: %w", path, err)
	}
	// The socket file goes when the listener closes.
	ln.(*net.UnixListener).SetUnlinkOnClose(true)
	if err := os.Chmod(path, 0o666); err != nil {
		ln.Close()
		return nil, fmt.Errorf("listen unix:%s: %w", path, err)
	}
	return ln, nil
}
