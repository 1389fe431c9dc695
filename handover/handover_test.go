package handover

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// childEnv makes the test binary the successor server (TestMain).
const childEnv = "ALKBLOBFS_HANDOVER_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		if err := runSuccessor(); err != nil {
			fmt.Fprintln(os.Stderr, "successor:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// The tree both servers serve: "a" has fixed bytes, "who" the serving
// process's pid, so a read shows which process answered it.
var dataA = bytes.Repeat([]byte("0123456789abcdef"), 4096)

const whoSize = 32

func whoContent() []byte { return fmt.Appendf(nil, "%-*d\n", whoSize-1, os.Getpid()) }

var inos = map[string]uint64{"a": 10, "who": 11}

type root struct{ fs.Inode }

func (r *root) Lookup(ctx context.Context, name string, out *fuse.EntryOut) (*fs.Inode, syscall.Errno) {
	n, attr, ok := nodeFor(name)
	if !ok {
		return nil, syscall.ENOENT
	}
	out.Attr.Size, out.Attr.Mode = n.size(), 0444
	return r.NewInode(ctx, n, attr), 0
}

func nodeFor(name string) (*file, fs.StableAttr, bool) {
	ino, ok := inos[name]
	return &file{name: name}, fs.StableAttr{Mode: syscall.S_IFREG, Ino: ino}, ok
}

type file struct {
	fs.Inode
	name string
}

func (f *file) size() uint64 {
	if f.name == "who" {
		return whoSize
	}
	return uint64(len(dataA))
}

func (f *file) Getattr(ctx context.Context, fh fs.FileHandle, out *fuse.AttrOut) syscall.Errno {
	out.Size, out.Mode = f.size(), 0444
	return 0
}

func (f *file) Open(ctx context.Context, flags uint32) (fs.FileHandle, uint32, syscall.Errno) {
	// Direct I/O: every read reaches the server.
	return &handle{name: f.name}, fuse.FOPEN_DIRECT_IO, 0
}

type handle struct{ name string }

func (h *handle) Read(ctx context.Context, dest []byte, off int64) (fuse.ReadResult, syscall.Errno) {
	data := dataA
	if h.name == "who" {
		data = whoContent()
	}
	if off >= int64(len(data)) {
		return fuse.ReadResultData(nil), 0
	}
	return fuse.ReadResultData(data[off:min(off+int64(len(dest)), int64(len(data)))]), 0
}

var restorer = fs.Restorer{
	Node: func(ctx context.Context, st fs.NodeState, parent *fs.Inode) (fs.InodeEmbedder, error) {
		n, attr, ok := nodeFor(st.Key)
		if !ok || attr.Ino != st.Ino {
			return nil, fmt.Errorf("no node %q with inode %d", st.Key, st.Ino)
		}
		return n, nil
	},
	File: func(ctx context.Context, st fs.FileState, n *fs.Inode) (fs.FileHandle, error) {
		return &handle{name: st.Key}, nil
	},
}

func options() *fs.Options {
	var zero time.Duration
	return &fs.Options{EntryTimeout: &zero, AttrTimeout: &zero, NegativeTimeout: &zero}
}

// state is what the old server sends beside the fd.
type state struct {
	Init  fuse.InitState
	Table *fs.TableState
}

// runSuccessor is the new server: it receives the connection on fd 3,
// serves it, says "serving" on stdout, and returns once it is unmounted.
func runSuccessor() error {
	c, err := net.FileConn(os.NewFile(3, "handover"))
	if err != nil {
		return err
	}
	fd, data, err := Receive(c.(*net.UnixConn), 1<<20)
	if err != nil {
		return err
	}
	var st state
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("decode state: %w", err)
	}
	raw, res, err := fs.NewNodeFSFromState(&root{}, options(), st.Table, restorer)
	if err != nil {
		return err
	}
	if len(res.Skipped) > 0 {
		return fmt.Errorf("import skipped %v", res.Skipped)
	}
	srv, err := fuse.NewServerOnFD(raw, fd, st.Init, &fuse.MountOptions{})
	if err != nil {
		return err
	}
	if s := srv.NotifyResend(); !s.Ok() {
		return fmt.Errorf("NOTIFY_RESEND: %v", s)
	}
	// Requests queue in the kernel until Serve reads them.
	fmt.Println("serving")
	srv.Serve()
	return nil
}

// TestHandoverToAnotherProcess: the connection, its INIT and its node
// table go to a new process through Send and Receive; descriptors opened
// before keep reading (now answered by the new process), new opens
// and lookups relative to an open directory work, and the old
// process's server returns without unmounting.
func TestHandoverToAnotherProcess(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		if os.Getenv("ALKBLOBFS_REQUIRE_FUSE") != "" {
			t.Fatalf("no /dev/fuse: %v", err)
		}
		t.Skipf("no /dev/fuse: %v", err)
	}
	mnt := t.TempDir()
	rawA := fs.NewNodeFS(&root{}, options())
	a, err := fuse.NewServer(rawA, mnt, &fuse.MountOptions{})
	if err != nil {
		t.Fatalf("mount: %v", err)
	}
	servedA := make(chan struct{})
	go func() { a.Serve(); close(servedA) }()
	if err := a.WaitMount(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmount(t, mnt) })
	if !a.SupportsResend() {
		t.Skip("the kernel does not offer FUSE_HAS_RESEND")
	}

	fa := open(t, filepath.Join(mnt, "a"))
	fw := open(t, filepath.Join(mnt, "who"))
	dir := open(t, mnt)
	self := strconv.Itoa(os.Getpid())
	if got := readAll(t, fw); got != string(whoContent()) {
		t.Fatalf("before: who reads %q, want this process's pid %s", got, self)
	}

	child, lines := startSuccessor(t, mnt, a, rawA)
	select {
	case line := <-lines:
		if line != "serving" {
			t.Fatalf("successor: %q", line)
		}
	case <-time.After(20 * time.Second):
		abort(t, mnt)
		t.Fatal("the successor did not serve within 20 s (connection aborted)")
	}
	if err := a.Detach(10 * time.Second); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	select {
	case <-servedA:
	case <-time.After(10 * time.Second):
		t.Fatal("the old server's Serve did not return within 10 s of Detach")
	}

	pid := strconv.Itoa(child.Process.Pid)
	if got := strings.TrimSpace(readAll(t, fw)); got != pid {
		t.Errorf("after: the descriptor of who opened before reads %q, want the successor's pid %s", got, pid)
	}
	if got := readAll(t, fa); got != string(dataA) {
		t.Errorf("after: the descriptor of a opened before reads %d other bytes", len(got))
	}
	nfd, err := unix.Openat(int(dir.Fd()), "who", unix.O_RDONLY, 0)
	if err != nil {
		t.Fatalf("openat who in the directory opened before: %v", err)
	}
	fresh := os.NewFile(uintptr(nfd), "who")
	defer fresh.Close()
	if got := strings.TrimSpace(readAll(t, fresh)); got != pid {
		t.Errorf("a new open of who reads %q, want the successor's pid %s", got, pid)
	}
	for _, f := range []*os.File{fa, fw, dir} {
		if err := f.Close(); err != nil {
			t.Errorf("close %s: %v", f.Name(), err)
		}
	}
}

func open(t *testing.T, name string) *os.File {
	t.Helper()
	f, err := os.Open(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func readAll(t *testing.T, f *os.File) string {
	t.Helper()
	buf := make([]byte, len(dataA)+1)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		t.Fatalf("read %s: %v", f.Name(), err)
	}
	return string(buf[:n])
}

// startSuccessor stops a, exports its state and starts the successor
// process, sending it the connection and the state.
func startSuccessor(t *testing.T, mnt string, a *fuse.Server, rawA fuse.RawFileSystem) (*exec.Cmd, <-chan string) {
	t.Helper()
	sp, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	ours, theirs := os.NewFile(uintptr(sp[0]), "handover"), os.NewFile(uintptr(sp[1]), "handover-child")
	defer ours.Close()
	defer theirs.Close()

	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), childEnv+"=1")
	cmd.ExtraFiles = []*os.File{theirs} // fd 3
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		// The successor serves until the unmount: do it now
		// (the mount's own cleanup runs after this one).
		unmount(t, mnt)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("successor: %v", err)
			}
		case <-time.After(10 * time.Second):
			abort(t, mnt)
			cmd.Process.Kill()
			<-done
			t.Errorf("the successor did not exit within 10 s of the unmount")
		}
	})
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()

	if err := a.StopReading(10 * time.Second); err != nil {
		t.Fatalf("StopReading: %v", err)
	}
	table, err := fs.ExportState(rawA,
		func(n *fs.Inode) (string, error) { return n.Operations().(*file).name, nil },
		func(n *fs.Inode, f fs.FileHandle) (string, error) { return f.(*handle).name, nil })
	if err != nil {
		t.Fatalf("ExportState: %v", err)
	}
	data, err := json.Marshal(state{Init: a.InitState(), Table: table})
	if err != nil {
		t.Fatal(err)
	}
	fd, err := a.DupFD()
	if err != nil {
		t.Fatalf("DupFD: %v", err)
	}
	defer syscall.Close(fd)
	c, err := net.FileConn(ours)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := Send(c.(*net.UnixConn), fd, data); err != nil {
		t.Fatalf("Send: %v", err)
	}
	return cmd, lines
}

// unmount detaches the mount, whoever serves it, once.
func unmount(t *testing.T, mnt string) {
	if err := syscall.Unmount(mnt, syscall.MNT_DETACH); err != nil && err != syscall.EINVAL {
		t.Errorf("unmount %s: %v", mnt, err)
	}
}

// abort aborts the mount's FUSE connection, so that a test that gives up
// does not leave a request hanging.
func abort(t *testing.T, mnt string) {
	var st syscall.Stat_t
	if err := syscall.Stat(mnt, &st); err != nil {
		t.Logf("abort: %v", err)
		return
	}
	p := fmt.Sprintf("/sys/fs/fuse/connections/%d/abort", unix.Minor(uint64(st.Dev)))
	if err := os.WriteFile(p, []byte("1"), 0); err != nil {
		t.Logf("abort: %v", err)
	}
}

// TestReceiveRefuses: a message that is not a handover, or carries no
// descriptor, or a state over the limit, is refused and leaks nothing.
func TestReceiveRefuses(t *testing.T) {
	pair := func(t *testing.T) (*net.UnixConn, *net.UnixConn) {
		sp, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		conn := func(fd int) *net.UnixConn {
			f := os.NewFile(uintptr(fd), "sp")
			defer f.Close()
			c, err := net.FileConn(f)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			return c.(*net.UnixConn)
		}
		return conn(sp[0]), conn(sp[1])
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	// An unmounted /dev/fuse descriptor: what Receive accepts.
	devfuse, err := os.OpenFile("/dev/fuse", os.O_RDWR, 0)
	if err != nil {
		if os.Getenv("ALKBLOBFS_REQUIRE_FUSE") != "" {
			t.Fatalf("open /dev/fuse: %v", err)
		}
		t.Skipf("open /dev/fuse: %v", err)
	}
	defer devfuse.Close()

	t.Run("round trip", func(t *testing.T) {
		s, r := pair(t)
		if err := Send(s, int(devfuse.Fd()), []byte("state")); err != nil {
			t.Fatal(err)
		}
		fd, st, err := Receive(r, 16)
		if err != nil {
			t.Fatal(err)
		}
		defer syscall.Close(fd)
		var a, b syscall.Stat_t
		syscall.Fstat(fd, &a)
		syscall.Fstat(int(devfuse.Fd()), &b)
		if string(st) != "state" || a.Rdev != b.Rdev || a.Ino != b.Ino {
			t.Errorf("received %q and a descriptor of %d/%d, want %q and /dev/fuse's %d/%d", st, a.Rdev, a.Ino, "state", b.Rdev, b.Ino)
		}
	})
	t.Run("too large", func(t *testing.T) {
		s, r := pair(t)
		if err := Send(s, int(devfuse.Fd()), make([]byte, 17)); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Receive(r, 16); !errors.Is(err, ErrProtocol) {
			t.Errorf("a state over the limit: %v, want ErrProtocol", err)
		}
	})
	t.Run("no descriptor", func(t *testing.T) {
		s, r := pair(t)
		if _, err := s.Write([]byte("AFH1\x00\x00\x00\x00\x00\x00\x00\x00")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Receive(r, 16); !errors.Is(err, ErrProtocol) {
			t.Errorf("no descriptor: %v, want ErrProtocol", err)
		}
	})
	t.Run("bad magic", func(t *testing.T) {
		s, r := pair(t)
		if _, _, err := s.WriteMsgUnix([]byte("XXXX\x00\x00\x00\x00\x00\x00\x00\x00"), syscall.UnixRights(int(devfuse.Fd())), nil); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Receive(r, 16); !errors.Is(err, ErrProtocol) {
			t.Errorf("bad magic: %v, want ErrProtocol", err)
		}
	})
	t.Run("not /dev/fuse", func(t *testing.T) {
		s, r := pair(t)
		if err := Send(s, int(devnull.Fd()), []byte("state")); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Receive(r, 16); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "not /dev/fuse") {
			t.Errorf("a /dev/null descriptor: %v, want ErrProtocol naming /dev/fuse", err)
		}
	})
	t.Run("truncated control data", func(t *testing.T) {
		s, r := pair(t)
		fd := int(devfuse.Fd())
		if _, _, err := s.WriteMsgUnix([]byte("AFH1\x00\x00\x00\x00\x00\x00\x00\x00"), syscall.UnixRights(fd, fd, fd, fd, fd, fd, fd, fd), nil); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Receive(r, 16); !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), "truncated") {
			t.Errorf("eight descriptors: %v, want ErrProtocol for truncated control data", err)
		}
	})
}
