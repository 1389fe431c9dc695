package fusefs

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log"
	"log/slog"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	gofs "github.com/hanwen/go-fuse/v2/fs"
	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/fusefs/fusectl"
	"github.com/alkblobfs/alkblobfs/upkeep"
)

// Server is a mounted alkblobfs. It serves until Unmount, or until someone
// runs umount on the mountpoint; Done is closed once it has stopped and
// cleaned up.
type Server struct {
	fs     *FS
	server *fuse.Server
	bridge fuse.RawFileSystem // the node table (gofs.NewNodeFS), for a handover's export
	dir    string
	// handedOver: the connection went to a successor (handover.go): the
	// cleanup releases what this process held and leaves the pid record,
	// the successor's now.
	handedOver atomic.Bool

	done      chan struct{}
	closeOnce sync.Once
	watch     *watch        // other hosts' changes (watch.go); nil without a feed
	guard     *guardProc    // the guard (guard.go); nil without one
	minor     atomic.Uint64 // the connection's number (fusectl), once serving
}

// Mount request sizes. 1 MiB is the kernel's largest FUSE request (256
// pages): a sequential copy is then one request per MiB each way, and
// readahead asks for up to 1 MiB ahead.
const (
	maxWrite     = 1 << 20
	maxReadAhead = 1 << 20
)

// Mount mounts the store on dir and starts serving. It fails with one
// clear error when dir is missing, not a directory or already mounted, or
// when FUSE is unavailable; a stale mount left by a killed daemon
// ("transport endpoint is not connected") is lazily unmounted first.
func Mount(dir string, cfg Config) (*Server, error) {
	f, err := newFS(cfg)
	if err != nil {
		return nil, err
	}
	abs, err := prepareMountpoint(dir, cfg.NonEmpty, cfg.AllowOther, f.log)
	if err != nil {
		return nil, err
	}
	// Before serving: publish what an earlier life of this mountpoint
	// committed at a close but had not linked when it died.
	f.intents.start(abs)
	opts := f.nodeOptions()
	bridge := gofs.NewNodeFS(f.root, opts)
	server, err := fuse.NewServer(f.observed(bridge), abs, &opts.MountOptions)
	if err != nil {
		f.intents.close()
		return nil, mountError(abs, err)
	}
	go server.Serve()
	if err := server.WaitMount(); err != nil {
		server.Unmount()
		f.intents.close()
		return nil, mountError(abs, err)
	}
	m := &Server{fs: f, server: server, bridge: bridge, dir: abs, done: make(chan struct{})}
	m.start("mounted")
	return m, nil
}

// start runs what a mount does once it serves, and a takeover once it
// has taken the connection: the pid record, the passthrough probe, the
// liveness source, the change feed, the guard, the timers; and the wait
// for the end.
func (m *Server) start(msg string) {
	f, abs, server, cfg := m.fs, m.dir, m.server, m.fs.cfg
	f.mount = m
	if c, ok, err := fusectl.Find(abs); err == nil && ok {
		m.minor.Store(c.Minor)
	}
	if err := writePidFile(abs); err != nil {
		f.log.Warn("could not record the daemon's pid; a later mount cannot recover this one if it dies stuck", "err", err)
	}
	prunePidFiles()
	f.probePassthrough(server)
	if err := raiseReadahead(abs); err != nil {
		f.log.Debug("could not raise the mount's readahead", "err", err)
	}
	f.refsSource = f.st.Register(f.refs)
	m.watch = f.startWatch()
	// A guard aborts the connection of a daemon killed while its feed
	// notifies the kernel, or restarts one that crashed (restart.go).
	if (m.watch != nil || cfg.RestartOnCrash) && cfg.Guard {
		var err error
		if m.guard, err = startGuard(abs, server, cfg.RestartOnCrash); err != nil {
			f.log.Warn("no mount guard: a kill of this daemon during a cache invalidation may hang the mount until it is mounted again or umount --force", "err", err)
		}
	}
	f.upkeep.Start()
	pt := "active"
	if !f.ptAvailable.Load() {
		pt = "off: " + f.ptReason.Load().(string)
	}
	f.log.Info(msg, "mountpoint", abs, "data", f.cfg.Data, "source", cmp.Or(f.cfg.Source, "alkblobfs"), "verify", string(f.cfg.Verify), "passthrough", pt,
		"sweep_every", f.cfg.SweepEvery, "scrub_every", f.cfg.ScrubEvery, "receipt_ttl", f.cfg.ReceiptTTL)
	go func() {
		server.Wait()
		m.cleanup()
	}()
}

// observed is the node table as the server calls it: timed, when the
// mount's requests are observed (Config.Observe).
func (f *FS) observed(bridge fuse.RawFileSystem) fuse.RawFileSystem {
	if f.cfg.Observe == nil {
		return bridge
	}
	return &timedFS{RawFileSystem: bridge, observe: f.cfg.Observe}
}

// nodeOptions are the mount's go-fuse options: a mount and a takeover
// (handover.go) serve with the same.
func (f *FS) nodeOptions() *gofs.Options {
	sec := defaultTimeout
	return &gofs.Options{
		EntryTimeout: &sec,
		AttrTimeout:  &sec,
		// A mode with no permission bits is a mode: go-fuse would show
		// 0644/0755 for it, and the kernel's default_permissions would
		// then open a chmod 000 namespace to everyone. Every node sets its
		// full mode itself (TestModesShown).
		NullPermissions: true,
		MountOptions: fuse.MountOptions{
			AllowOther:   f.cfg.AllowOther,
			Options:      mountOptions(f.cfg),
			MaxWrite:     maxWrite,
			MaxReadAhead: maxReadAhead,
			// Readahead and parallel readers issue async requests; the
			// default of 12 in flight throttles a fast disk.
			MaxBackground: 64,
			FsName:        cmp.Or(f.cfg.Source, "alkblobfs"),
			Name:          "alkblobfs",
			// As root, mount(2) directly: no fusermount3 needed.
			DirectMount: os.Geteuid() == 0,
			Debug:       f.cfg.Debug,
			Logger:      log.New(&slogWriter{l: f.log}, "", 0),
			// O_TRUNC arrives with OPEN (one request, atomic for uploads);
			// plain `ls` may skip READDIRPLUS's per-entry lookups.
			// HANDLE_KILLPRIV_V2: the daemon clears set-id bits on write,
			// truncate and chown (meta.killPriv), so the kernel stops
			// asking GETXATTR("security.capability") before every WRITE:
			// one round trip per file instead of one per 1 MiB.
			// DIRECT_IO_ALLOW_MMAP: incoming files open for writing are
			// FOPEN_DIRECT_IO (writeOpen) and may still be mmapped. No
			// CAP_WRITEBACK_CACHE: it pipelines writes into incoming/
			// (a 1 GiB cp ~25% faster), but the kernel then refuses
			// passthrough, and reads of blobs matter more.
			ExtraCapabilities: fuse.CAP_ATOMIC_O_TRUNC | fuse.CAP_READDIRPLUS_AUTO | fuse.CAP_HANDLE_KILLPRIV_V2 | fuse.CAP_DIRECT_IO_ALLOW_MMAP,
			// Content changes only through this mount's own writes, and
			// blobs never: the kernel need not drop pages when an mtime
			// it sees changes (a blob linked in two namespaces shows two).
			ExplicitDataCacheControl: true,
			// No IgnoreSecurityLabels: it answers ACL and capability
			// xattrs ENODATA, and ls then asks again for every entry; the
			// nodes answer EOPNOTSUPP (foreignXattr), and ls stops.
			// A bug must cost one request, not the daemon, and be seen.
			PanicHandler: func(v any) fuse.Status {
				f.log.Error(panicLog, "panic", fmt.Sprint(v), "stack", string(debug.Stack()))
				return fuse.EIO
			},
		},
		Logger:         log.New(&slogWriter{l: f.log, prefix: "go-fuse: "}, "", 0),
		RootStableAttr: &gofs.StableAttr{Ino: inoRoot},
	}
}

// Dir is the absolute mountpoint.
func (m *Server) Dir() string { return m.dir }

// Done is closed when the mount has stopped serving and cleaned up.
func (m *Server) Done() <-chan struct{} { return m.done }

// Wait blocks until Done.
func (m *Server) Wait() { <-m.done }

// Passthrough reports whether FUSE passthrough is in use.
func (m *Server) Passthrough() bool { return m.fs.ptAvailable.Load() }

// Stats is the mount's /.alkblobfs/stats.
func (m *Server) Stats(ctx context.Context) Stats { return m.fs.Stats(ctx) }

// Upkeep is the mount's sweeper and scrubber.
func (m *Server) Upkeep() *upkeep.Upkeep { return m.fs.upkeep }

// Counters is Stats without the namespace count (cheap: no registry walk).
func (m *Server) Counters() Stats { return m.fs.Counters() }

// Unmount unmounts and waits until serving has stopped. If files are
// still open (EBUSY), it detaches the mount lazily: the name goes at
// once, and the daemon serves the open files until they are closed.
func (m *Server) Unmount() error {
	select {
	case <-m.done:
		return nil
	default:
	}
	// A scrub started from the control file keeps that file open (its
	// write lasts as long as the scrub): end it, or the unmount would
	// wait for it.
	m.fs.upkeep.Scrubber.Stop()
	if err := m.server.Unmount(); err != nil {
		select {
		case <-m.done: // unmounted by someone else meanwhile
			return nil
		default:
		}
		m.fs.log.Warn("mount busy; detaching lazily: the mountpoint is free now and open files are served until closed",
			"mountpoint", m.dir, "open_handles", m.fs.stats.openHandles.Load(),
			"open_control_files", m.fs.stats.controlHandles.Load(), "err", err)
		if derr := detach(m.dir); derr != nil {
			return fmt.Errorf("unmount %s: %v; lazy unmount: %w", m.dir, err, derr)
		}
	}
	<-m.done
	return nil
}

// cleanup runs once serving has stopped: in-flight uploads are
// discarded (nothing half-published), pins of handles the kernel never
// released are dropped, the timer stops.
func (m *Server) cleanup() {
	m.closeOnce.Do(func() {
		f := m.fs
		f.upkeep.Stop()
		f.cancel()
		m.watch.stop()
		for _, d := range f.nsDirs() {
			d.teardown()
		}
		if m.handedOver.Load() {
			// The successor holds its own pins and references on what
			// it serves (taken before this process let go): drop ours.
			f.releaseBlobHandles()
		}
		f.intents.close()
		if f.refsSource != nil {
			f.refsSource.Deregister()
		}
		if m.handedOver.Load() {
			f.log.Info("handed over", "mountpoint", m.dir)
		} else {
			removePidFile(m.dir)
			os.Remove(restartGenFile(m.dir))
			f.log.Info("unmounted", "mountpoint", m.dir)
		}
		close(m.done)
	})
}

// panicLog is the message logged when a FUSE request panics.
const panicLog = "panic in a FUSE request; answered EIO"

// prepareMountpoint checks dir and clears a stale mount on it.
func prepareMountpoint(dir string, nonEmpty, allowOther bool, lg *slog.Logger) (string, error) {
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return "", fmt.Errorf("FUSE is not available: %w (load the fuse module, or give the container /dev/fuse)", err)
	}
	if err := checkUnprivileged(allowOther); err != nil {
		return "", err
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	// Before anything touches the mountpoint: a mount whose daemon died
	// with a thread stuck in the kernel would put this process to sleep.
	if err := clearDeadMount(abs, lg); err != nil {
		return "", err
	}
	fi, err := os.Stat(abs)
	if errors.Is(err, syscall.ENOTCONN) || errors.Is(err, syscall.ECONNABORTED) {
		lg.Warn("stale mount left by a daemon that died (transport endpoint is not connected); unmounting it lazily", "mountpoint", abs)
		if derr := detach(abs); derr != nil {
			return "", fmt.Errorf("mountpoint %s: stale mount, and lazy unmount failed: %w", abs, derr)
		}
		fi, err = os.Stat(abs)
	}
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", fmt.Errorf("mountpoint %s does not exist", abs)
	case err != nil:
		return "", fmt.Errorf("mountpoint %s: %w", abs, err)
	case !fi.IsDir():
		return "", fmt.Errorf("mountpoint %s is not a directory", abs)
	}
	if real, err := filepath.EvalSymlinks(abs); err == nil {
		abs = real
	}
	if _, mounted, err := fusectl.Find(abs); err == nil && mounted {
		return "", fmt.Errorf("mountpoint %s is busy: something is already mounted there", abs)
	}
	if !nonEmpty {
		// Files under a mount are hidden while it lasts, as for any
		// filesystem; say so rather than hide them silently.
		if d, err := os.Open(abs); err == nil {
			names, _ := d.Readdirnames(1)
			d.Close()
			if len(names) > 0 {
				return "", fmt.Errorf("mountpoint %s is not empty (it holds %q): its files would be hidden while mounted; mount over it with --nonempty (fstab: nonempty)", abs, names[0])
			}
		}
	}
	return abs, nil
}

// detach is umount -l: MNT_DETACH as root, fusermount3 -uz otherwise.
func detach(dir string) error {
	err := unix.Unmount(dir, unix.MNT_DETACH)
	if err == nil || !errors.Is(err, unix.EPERM) {
		return err
	}
	if ferr := fusermount(dir, "-uz"); !errors.Is(ferr, exec.ErrNotFound) {
		return ferr
	}
	return err
}

// fusermount runs fusermount3 with flag on dir, for users who may not
// call umount(2).
func fusermount(dir, flag string) error {
	bin, err := exec.LookPath("fusermount3")
	if err != nil {
		return err
	}
	if out, err := exec.Command(bin, flag, dir).CombinedOutput(); err != nil {
		msg := strings.TrimSpace(string(out))
		if strings.Contains(msg, "Device or resource busy") {
			return fmt.Errorf("%s %s: %s: %w", bin, flag, msg, unix.EBUSY)
		}
		return fmt.Errorf("%s %s: %v: %s", bin, flag, err, msg)
	}
	return nil
}

// fuseConf is fusermount3's configuration (a variable for tests).
var fuseConf = "/etc/fuse.conf"

// checkUnprivileged finds, before fusermount3 does, the two reasons a
// mount by a user other than root fails, and says how to fix each:
// fusermount3 itself would only exit with status 1.
func checkUnprivileged(allowOther bool) error {
	if os.Geteuid() == 0 {
		return nil
	}
	if err := unix.Access("/dev/fuse", unix.R_OK|unix.W_OK); err != nil {
		return fmt.Errorf("cannot open /dev/fuse as %s: %w (make it usable by this user: chmod 0666 /dev/fuse, as most distributions ship it, or mount as root)", currentUser(), err)
	}
	if allowOther && !userAllowOther() {
		return fmt.Errorf("--allow-other as %s needs user_allow_other in %s (uncomment it there), or mount as root", currentUser(), fuseConf)
	}
	return nil
}

// userAllowOther reports whether fuse.conf has an uncommented
// user_allow_other line.
func userAllowOther() bool {
	b, err := os.ReadFile(fuseConf)
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "user_allow_other" {
			return true
		}
	}
	return false
}

func currentUser() string {
	if u, err := user.Current(); err == nil {
		return "user " + u.Username
	}
	return fmt.Sprintf("uid %d", os.Geteuid())
}

func mountError(dir string, err error) error {
	switch {
	case errors.Is(err, syscall.EBUSY):
		return fmt.Errorf("mountpoint %s is busy: %w", dir, err)
	case errors.Is(err, syscall.EPERM), errors.Is(err, syscall.EACCES):
		return fmt.Errorf("mount %s: permission denied (run as root, or install fusermount3): %w", dir, err)
	}
	return fmt.Errorf("mount %s: %w", dir, err)
}

// probePassthrough finds out whether the kernel will read local blobs
// directly. go-fuse would turn passthrough off silently on the first
// failed registration, so the mount tries one up front, on a file of the
// same filesystem as the blobs, and logs the answer.
func (f *FS) probePassthrough(srv *fuse.Server) {
	no := func(why string) {
		f.ptAvailable.Store(false)
		f.ptReason.Store(why)
	}
	if f.cfg.NoPassthrough {
		no("turned off (--passthrough=false)")
		return
	}
	if srv.KernelSettings().Flags64()&fuse.CAP_PASSTHROUGH == 0 {
		no("the kernel does not offer FUSE passthrough")
		return
	}
	u, ok, err := f.st.StatFS()
	if !ok || err != nil {
		no("no local large tier")
		return
	}
	fd, err := unix.Open(u.Dir, unix.O_TMPFILE|unix.O_RDWR|unix.O_CLOEXEC, 0o600)
	if err != nil {
		no(fmt.Sprintf("probe file: %v", err))
		return
	}
	defer unix.Close(fd)
	id, errno := srv.RegisterBackingFd(&fuse.BackingMap{Fd: int32(fd)})
	if errno != 0 {
		no(fmt.Sprintf("registering a backing file: %v (needs CAP_SYS_ADMIN)", errno))
		return
	}
	srv.UnregisterBackingFd(id)
	f.ptAvailable.Store(true)
	f.ptReason.Store("")
}

// raiseReadahead sets the mount's readahead to 1 MiB: the kernel starts
// FUSE mounts at 128 KiB whatever the INIT reply asks for.
func raiseReadahead(dir string) error {
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return err
	}
	p := fmt.Sprintf("/sys/class/bdi/%d:%d/read_ahead_kb", unix.Major(st.Dev), unix.Minor(st.Dev))
	return os.WriteFile(p, []byte(strconv.Itoa(maxReadAhead>>10)), 0)
}

// slogWriter sends go-fuse's log.Logger output to slog, each line after
// prefix: at debug level (its --debug trace of every request), but for
// goFuseWarnings.
type slogWriter struct {
	l      *slog.Logger
	prefix string
}

func (w *slogWriter) Write(p []byte) (int, error) {
	line := strings.TrimSpace(string(p))
	w.l.Log(context.Background(), goFuseLevel(line), w.prefix+line)
	return len(p), nil
}

// goFuseWarnings begin go-fuse's lines that say what a handover did with
// a request or an id (the patched fs/handover.go, fuse/handover.go,
// bridge.go: an id answered ESTALE, a request left for the successor, a
// resend that failed) or that a call into the kernel failed: the log of
// a failed upgrade must show them without --log-level debug.
var goFuseWarnings = []string{"handover:", "NOTIFY_RESEND", "stopping:", "fuse: resuming", "UnregisterBackingFd"}

// goFuseLevel is the level of a go-fuse log line.
func goFuseLevel(line string) slog.Level {
	for _, p := range goFuseWarnings {
		if strings.HasPrefix(line, p) {
			return slog.LevelWarn
		}
	}
	return slog.LevelDebug
}

// mountOptions are the -o options of the mount. With --allow-other the
// kernel checks every access against the mode, owner and group each node
// shows (default_permissions): namespaces are their owners', the root and
// the control files the mounting user's.
func mountOptions(cfg Config) []string {
	var o []string
	if cfg.ReadOnly {
		o = append(o, "ro")
	}
	if cfg.AllowOther {
		o = append(o, "default_permissions")
	}
	return o
}
