package fusefs

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/alkblobfs/alkblobfs/fusefs/fusectl"
	"github.com/alkblobfs/alkblobfs/rundir"
)

// Restart after a crash (mount --restart-on-crash). The guard (guard.go)
// keeps a duplicate of the daemon's /dev/fuse descriptor — the same
// open file description, so the connection outlives the daemon — with
// what INIT settled and the daemon's command line. When the daemon dies
// without having unmounted or handed the mount over, the guard runs that
// command line again on the descriptor, and the new daemon serves the
// live connection (Restart) with no node table: the root only, and
// every node id and file handle the dead daemon gave out answered
// ESTALE, never taken for a new node's or handle's. It sends
// FUSE_NOTIFY_RESEND before it serves, so a request the dead daemon read
// and never answered comes back and is answered instead of hanging.
//
// What a program sees: a descriptor opened before gets ESTALE at its
// next request to the daemon (pages the kernel cached, and passthrough
// reads, still read right; its close may report EIO); a new open, cat,
// ls or stat works at once (the kernel, given ESTALE for a cached
// entry, looks the path up again from the root). The store follows the
// crash rules of any kill: pins and the writer lease of the dead daemon
// lapse, versions an fsync committed are published by the new one
// (intents.start), files being written in incoming/ are lost.
//
// Each restart of a connection is a generation, counted in a record
// beside the pid record (restartGen): its node ids and handle epoch come
// from a range of their own, above any an earlier generation, or an
// upgrade of one, handed out. A third crash within a minute, or a
// restart that cannot start, makes the guard abort the connection as it
// does without --restart-on-crash.

// The environment a guard gives the daemon it restarts.
const (
	envRestartFD   = "ALKBLOBFS_RESTART_FD"   // the /dev/fuse descriptor
	envRestartInit = "ALKBLOBFS_RESTART_INIT" // fuse.InitState, JSON
	envRestartGen  = "ALKBLOBFS_RESTART_GEN"  // the restart's generation, from 1
)

// Ranges of a restart's node ids, inode numbers and handle epochs:
// generation g starts at base + g<<shift. An upgrade moves a table's
// counters on by 2^40 node ids and 4096 epochs (the fork's ExportState),
// so a generation has room for 2^10 upgrades before it meets the next.
const (
	restartNodeBase   = 1 << 62
	restartInoBase    = 1 << 63 // above go-fuse's automatic numbers' start
	restartNodeShift  = 50
	restartEpochBase  = 1 << 31
	restartEpochShift = 20
	// maxRestartGen keeps every range below 2^64 (and epochs below 2^32).
	maxRestartGen = 1<<(32-restartEpochShift-1) - 1
)

// Restarted is what a daemon started by its guard after a crash takes
// over: nil in a process the guard did not start.
type Restarted struct {
	fd   int
	init fuse.InitState
	gen  uint64
}

// RestartedFromEnv reads the environment a guard gives the daemon it
// restarts, and removes it, so that no child of this process inherits
// it. It returns nil, nil for a process the guard did not start.
func RestartedFromEnv() (*Restarted, error) {
	fdv, initv, genv := os.Getenv(envRestartFD), os.Getenv(envRestartInit), os.Getenv(envRestartGen)
	for _, k := range []string{envRestartFD, envRestartInit, envRestartGen} {
		os.Unsetenv(k)
	}
	if fdv == "" {
		return nil, nil
	}
	fd, err := strconv.Atoi(fdv)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q: not a descriptor", envRestartFD, fdv)
	}
	syscall.CloseOnExec(fd)
	r := &Restarted{fd: fd}
	if err := json.Unmarshal([]byte(initv), &r.init); err != nil {
		syscall.Close(fd)
		return nil, fmt.Errorf("%s: %w", envRestartInit, err)
	}
	if r.gen, err = strconv.ParseUint(genv, 10, 64); err != nil || r.gen == 0 || r.gen > maxRestartGen {
		syscall.Close(fd)
		return nil, fmt.Errorf("%s=%q: not a generation", envRestartGen, genv)
	}
	return r, nil
}

// Generation is the restart's: 1 for the first restart of a connection.
func (r *Restarted) Generation() uint64 { return r.gen }

// Restart serves the live connection a crashed daemon left, as its
// guard restarted this process to (RestartedFromEnv), on the mountpoint
// the INIT state names.
func Restart(r *Restarted, cfg Config) (*Server, error) {
	f, err := newFS(cfg)
	if err != nil {
		syscall.Close(r.fd)
		return nil, err
	}
	dir := r.init.MountPoint
	if dir == "" {
		syscall.Close(r.fd)
		return nil, errors.New("restart: the saved INIT names no mountpoint")
	}
	// Before serving, as a mount does: the dead daemon's fsynced
	// versions are published (its lease lapsed with it).
	f.intents.start(dir)
	opts := f.nodeOptions()
	table := &gofs.TableState{
		Version:          gofs.TableStateVersion,
		Epoch:            uint32(restartEpochBase+r.gen<<restartEpochShift) - 1, // the importer takes Epoch+1
		NextNodeID:       restartNodeBase + r.gen<<restartNodeShift,
		NextAutomaticIno: restartInoBase + r.gen<<restartNodeShift,
	}
	bridge, _, err := gofs.NewNodeFSFromState(f.root, opts, table, gofs.Restorer{
		Node: func(context.Context, gofs.NodeState, *gofs.Inode) (gofs.InodeEmbedder, error) {
			return nil, errors.New("no node survives a crash")
		},
	})
	if err != nil {
		syscall.Close(r.fd)
		f.intents.close()
		return nil, fmt.Errorf("restart: %w", err)
	}
	server, err := fuse.NewServerOnFD(f.observed(bridge), r.fd, r.init, &opts.MountOptions)
	if err != nil {
		f.intents.close()
		return nil, fmt.Errorf("restart: %w", err)
	}
	m := &Server{fs: f, server: server, bridge: bridge, dir: dir, done: make(chan struct{})}
	f.mount = m
	m.serveResent("restarted after a crash", "the dead daemon")
	return m, nil
}

// restartGenFile records the restarts of the connection on dir: "minor
// generation".
func restartGenFile(dir string) string {
	return strings.TrimSuffix(pidFile(dir), ".pid") + ".restarts"
}

// restartGen is the generation of connection minor on dir: how many
// times its guard restarted its daemon.
func restartGen(dir string, minor uint64) uint64 {
	b, err := os.ReadFile(restartGenFile(dir))
	if err != nil || minor == 0 {
		return 0
	}
	var m, g uint64
	if _, err := fmt.Sscan(string(b), &m, &g); err != nil || m != minor {
		return 0
	}
	return g
}

// nextRestartGen counts one more restart of connection minor on dir and
// returns its generation: 1 for a connection not restarted before.
func nextRestartGen(dir string, minor uint64) (uint64, error) {
	p := restartGenFile(dir)
	gen := restartGen(dir, minor) + 1
	if gen > maxRestartGen {
		return 0, fmt.Errorf("connection %d was restarted %d times, the most one can be", minor, gen-1)
	}
	if err := rundir.Make(filepath.Dir(p)); err != nil {
		return 0, err
	}
	if err := writeRecord(p, fmt.Sprintf("%d %d\n", minor, gen)); err != nil {
		return 0, err
	}
	return gen, nil
}

// errUnmounted: the guard's mount went away while its daemon exited (an
// unmount, then the exit): nothing to restart.
var errUnmounted = errors.New("the mount is gone")

// maxRestartsAMinute: a third crash within a minute is not restarted.
const maxRestartsAMinute = 2

// restarter is a guard's side of a restart: the daemon's command line,
// what INIT settled, the connection, and the restarts of the last
// minute.
type restarter struct {
	dir    string
	minor  uint64
	args   []string
	init   string
	conn   *os.File // guardFD, kept referenced: its finalizer would close it
	lg     *slog.Logger
	recent []time.Time
}

// daemonRef is a daemon the guard watches: its pid and start time.
type daemonRef struct {
	pid   int
	start uint64
}

func newRestarter(dir string, minor uint64) *restarter {
	r := &restarter{
		dir:   dir,
		minor: minor,
		init:  os.Getenv(envRestartInit),
		conn:  os.NewFile(guardFD, "/dev/fuse"),
		lg:    slog.New(slog.NewTextHandler(os.Stderr, nil)),
	}
	json.Unmarshal([]byte(os.Getenv(envGuardArgs)), &r.args) // none: restart says so
	os.Unsetenv(envGuardArgs)
	os.Unsetenv(envRestartInit)
	return r
}

func (r *restarter) log(format string, a ...any) {
	r.lg.Error(fmt.Sprintf(format, a...), "mountpoint", r.dir)
}

// restart starts the daemon's command line again on the connection, and
// returns the new daemon.
func (r *restarter) restart() (daemonRef, error) {
	if m, ok, err := fusectl.Find(r.dir); err == nil && (!ok || m.Minor != r.minor) {
		return daemonRef{}, errUnmounted
	}
	now := time.Now()
	r.recent = slices.DeleteFunc(r.recent, func(t time.Time) bool { return now.Sub(t) > time.Minute })
	if len(r.recent) >= maxRestartsAMinute {
		return daemonRef{}, fmt.Errorf("it died %d times within a minute", len(r.recent)+1)
	}
	if len(r.args) == 0 || r.args[0] == "" || r.init == "" {
		return daemonRef{}, errors.New("the guard was not given the daemon's command line")
	}
	gen, err := nextRestartGen(r.dir, r.minor)
	if err != nil {
		return daemonRef{}, err
	}
	cmd := &exec.Cmd{
		Path:        "/proc/self/exe",
		Args:        r.args,
		Env:         append(os.Environ(), envRestartFD+"="+strconv.Itoa(guardFD), envRestartInit+"="+r.init, envRestartGen+"="+strconv.FormatUint(gen, 10)),
		ExtraFiles:  []*os.File{r.conn},
		Stderr:      os.Stderr,
		SysProcAttr: &syscall.SysProcAttr{Setsid: true},
	}
	if err := cmd.Start(); err != nil {
		return daemonRef{}, fmt.Errorf("restart: %w", err)
	}
	go cmd.Wait() // reaps it
	r.recent = append(r.recent, now)
	start, err := procStart(cmd.Process.Pid)
	if err != nil {
		// Gone already: the next look restarts it again, or gives up.
		return daemonRef{pid: cmd.Process.Pid}, nil
	}
	r.lg.Warn("the mount's daemon died; restarted it on the live connection (handles opened before answer ESTALE)",
		"mountpoint", r.dir, "pid", cmd.Process.Pid, "restart", gen)
	return daemonRef{pid: cmd.Process.Pid, start: start}, nil
}
