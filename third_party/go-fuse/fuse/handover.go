// Copyright 2026 the Go-FUSE Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.

package fuse

// Handing a live FUSE connection from one server to another (an upgrade
// without unmounting; upstream discussion: hanwen/go-fuse#618).
//
// The kernel keeps a connection alive as long as some process holds its
// /dev/fuse file description, and it sends INIT only once. So the old
// server (A) stops reading without closing or unmounting
// (StopReading), exports what INIT settled (InitState) and passes a
// duplicate of the fd (DupFD) to the new server (B), by SCM_RIGHTS or
// inheritance. B starts on that fd with the saved parameters
// (NewServerOnFD) instead of waiting for an INIT, and asks the kernel
// to queue again every request A read and did not answer
// (NotifyResend, FUSE_NOTIFY_RESEND). A then Detaches, or, if B failed,
// resumes (ResumeReading).

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// InitStateVersion is the format version of InitState. A reader refuses
// a newer one (InitState.Check).
const InitStateVersion = 1

// InitState is what the INIT exchange of a connection settled: the
// kernel's offer and the server's answer. The kernel holds the
// connection to these values for its lifetime, so a server that takes
// over the connection must use them rather than negotiate its own. It
// is plain data: encode it with encoding/json or gob.
type InitState struct {
	Version int

	// MountPoint is the mount's directory, so that the successor can
	// Unmount. Empty for a mount made through /dev/fd/N.
	MountPoint string

	// The kernel's INIT request.
	KernelMajor        uint32
	KernelMinor        uint32
	KernelMaxReadAhead uint32
	KernelFlags        uint64

	// The server's INIT reply.
	Major               uint32
	Minor               uint32
	MaxReadAhead        uint32
	Flags               uint64
	MaxBackground       uint16
	CongestionThreshold uint16
	MaxWrite            uint32
	TimeGran            uint32
	MaxPages            uint16
	MapAlignment        uint16
	MaxStackDepth       uint32
	RequestTimeout      uint16
}

// Check reports whether this build can serve a connection with s: a
// known version, a reply it could have sent.
func (s *InitState) Check() error {
	switch {
	case s.Version <= 0:
		return fmt.Errorf("fuse init state: no version")
	case s.Version > InitStateVersion:
		return fmt.Errorf("fuse init state: version %d is newer than this build reads (%d)", s.Version, InitStateVersion)
	case s.Major != _FUSE_KERNEL_VERSION || s.KernelMajor != _FUSE_KERNEL_VERSION:
		return fmt.Errorf("fuse init state: protocol major %d/%d, want %d", s.KernelMajor, s.Major, _FUSE_KERNEL_VERSION)
	case s.Minor < _MINIMUM_MINOR_VERSION:
		return fmt.Errorf("fuse init state: protocol minor %d is older than this build supports (%d)", s.Minor, _MINIMUM_MINOR_VERSION)
	case s.MaxWrite == 0:
		return fmt.Errorf("fuse init state: max write 0")
	}
	return nil
}

func (s *InitState) kernelInit() InitIn {
	return InitIn{
		Major:        s.KernelMajor,
		Minor:        s.KernelMinor,
		MaxReadAhead: s.KernelMaxReadAhead,
		Flags:        uint32(s.KernelFlags),
		Flags2:       uint32(s.KernelFlags >> 32),
	}
}

func (s *InitState) reply() InitOut {
	return InitOut{
		Major:               s.Major,
		Minor:               s.Minor,
		MaxReadAhead:        s.MaxReadAhead,
		Flags:               uint32(s.Flags),
		Flags2:              uint32(s.Flags >> 32),
		MaxBackground:       s.MaxBackground,
		CongestionThreshold: s.CongestionThreshold,
		MaxWrite:            s.MaxWrite,
		TimeGran:            s.TimeGran,
		MaxPages:            s.MaxPages,
		MapAlignment:        s.MapAlignment,
		MaxStackDepth:       s.MaxStackDepth,
		RequestTimeout:      s.RequestTimeout,
	}
}

// InitState exports what INIT settled on this connection, for a
// successor's NewServerOnFD.
func (ms *Server) InitState() InitState {
	in, out := ms.kernelSettings, ms.initOut
	return InitState{
		Version:             InitStateVersion,
		MountPoint:          ms.mountPoint,
		KernelMajor:         in.Major,
		KernelMinor:         in.Minor,
		KernelMaxReadAhead:  in.MaxReadAhead,
		KernelFlags:         in.Flags64(),
		Major:               out.Major,
		Minor:               out.Minor,
		MaxReadAhead:        out.MaxReadAhead,
		Flags:               out.Flags64(),
		MaxBackground:       out.MaxBackground,
		CongestionThreshold: out.CongestionThreshold,
		MaxWrite:            out.MaxWrite,
		TimeGran:            out.TimeGran,
		MaxPages:            out.MaxPages,
		MapAlignment:        out.MapAlignment,
		MaxStackDepth:       out.MaxStackDepth,
		RequestTimeout:      out.RequestTimeout,
	}
}

// NegotiatedFlags returns the CAP_* flags this server answered INIT
// with (for a server started by NewServerOnFD: its predecessor's).
func (ms *Server) NegotiatedFlags() uint64 {
	return ms.negotiatedFlags
}

// NewServerOnFD starts a server on a connection that is already
// mounted and past INIT: fd is an open /dev/fuse description (received
// by SCM_RIGHTS or inherited; the server owns it from here), st what
// its INIT settled. The server serves at once: it does not wait for
// an INIT, which the kernel will not send again. Its negotiated flags,
// maximum write and the rest are st's, so features the kernel enabled
// at INIT (passthrough among them) keep working. Call NotifyResend
// before or right after Serve so that requests the previous server
// read and never answered are queued again.
//
// The options that INIT settled cannot change: opts.MaxWrite, if set,
// must equal st.MaxWrite. The other options that shape the INIT reply
// (capabilities, MaxBackground, MaxReadAhead...) are ignored.
//
// fd is the server's from the call on: on an error it is closed, so
// the caller never closes it (a descriptor kept open by mistake would
// keep the connection alive with nobody serving it).
func NewServerOnFD(fs RawFileSystem, fd int, st InitState, opts *MountOptions) (*Server, error) {
	ms, taken, err := newServerOnFD(fs, fd, st, opts)
	if err != nil && !taken && fd >= 0 {
		syscall.Close(fd)
	}
	return ms, err
}

// newServerOnFD is NewServerOnFD; taken reports whether fd is already
// the server's (closed by it on an error).
func newServerOnFD(fs RawFileSystem, fd int, st InitState, opts *MountOptions) (ms *Server, taken bool, err error) {
	if err := st.Check(); err != nil {
		return nil, false, err
	}
	if opts == nil {
		opts = &MountOptions{MaxBackground: _DEFAULT_BACKGROUND_TASKS}
	}
	o := *opts
	if o.MaxWrite != 0 && o.MaxWrite != int(st.MaxWrite) {
		return nil, false, fmt.Errorf("fuse: option MaxWrite %d differs from the connection's %d, fixed at INIT", o.MaxWrite, st.MaxWrite)
	}
	o.MaxWrite = int(st.MaxWrite)
	o.setDefaults(fs)
	if o.MaxWrite != int(st.MaxWrite) {
		return nil, false, fmt.Errorf("fuse: the connection's max write %d is more than this kernel allows (%d)", st.MaxWrite, o.MaxWrite)
	}

	ms = newServer(fs, &o)
	ms.kernelSettings = st.kernelInit()
	ms.initOut = st.reply()
	ms.negotiatedFlags = st.Flags
	ms.mountPoint = st.MountPoint

	// newFuseFD owns fd from here: it closes it on its error.
	ms.fuseFD, err = ms.newFuseFD(fd)
	if err != nil {
		return nil, true, err
	}
	ms.protocolServer.writev = ms.fuseFD.writev
	if ms.kernelSettings.Minor >= 13 {
		ms.setSplice()
	}
	ms.fileSystem.Init(ms)
	// The mount exists already: WaitMount has nothing to wait for.
	ms.ready <- nil
	ms.fuseFD.loops.Add(1)
	return ms, true, nil
}

// SupportsResend reports whether the kernel offered FUSE_HAS_RESEND at
// INIT: without it a request read and not answered is lost, so a
// handover is refused.
func (ms *Server) SupportsResend() bool {
	return ms.kernelSettings.Flags64()&CAP_HAS_RESEND != 0
}

// NotifyResend sends FUSE_NOTIFY_RESEND: the kernel queues again every
// request it sent on this connection and has no answer for, as a new
// request (the same unique with its top bit set). A server that takes
// over a connection sends it, so that what its predecessor read and
// did not answer is not lost.
func (ms *Server) NotifyResend() Status {
	if !ms.SupportsResend() {
		return ENOSYS
	}
	var h OutHeader
	h.Length = uint32(unsafe.Sizeof(h))
	h.Status = int32(-NOTIFY_RESEND) // notify codes go positive on the wire
	buf := unsafe.Slice((*byte)(unsafe.Pointer(&h)), unsafe.Sizeof(h))
	_, errno := ms.fuseFD.writev([][]byte{buf})
	if ms.opts.Debug {
		ms.opts.Logger.Printf("NOTIFY_RESEND: %v", errno)
	}
	return Status(errno)
}

// DupFD returns a new file descriptor for this server's /dev/fuse
// description, for the successor (send it by SCM_RIGHTS, or let a
// child inherit it). The caller owns it.
func (ms *Server) DupFD() (int, error) {
	nfd := -1
	var err error
	if cerr := ms.fuseFD.withFD(func(fd int) {
		// F_DUPFD_CLOEXEC: no window in which a concurrent
		// fork/exec could leak the connection to a child.
		nfd, err = unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	}); cerr != nil {
		return -1, cerr
	}
	return nfd, err
}

// AbortRequest is a panic value with which a file system's handler
// answers its request with Status, bypassing MountOptions.PanicHandler
// (no stack trace is logged). Package fs uses it for node ids and file
// handles that a server which took over a connection does not know,
// deep in lookups that have no error path.
type AbortRequest struct {
	Status Status
}

// ErrStopTimeout is what StopReading returns when its readers did not
// all stop in time. The server reads again by itself once the handlers
// still running have answered (see StopReading).
var ErrStopTimeout = errors.New("fuse: readers did not stop in time")

// handoverWakeName is the name StopReading looks up in the mount's
// root to wake a reader blocked in read(2). While a stop is in progress
// (readerGate.inProgress), a reader answers this process's own lookup
// of it ENOENT whether it is stopping or not (isHandoverWakeInput), so
// the lookup never waits on a stopped server. Outside a stop, and for
// other processes, it is a name like any other.
const handoverWakeName = ".go-fuse-handover-wake"

// maxWakes bounds the wake-up lookups in flight (each waits in a
// goroutine until a server answers it).
const maxWakes = 2 * maxMaxReaders

// isHandoverWakeInput reports whether in, a request's raw input, is
// StopReading's wake-up LOOKUP: a LOOKUP of handoverWakeName in the
// root made by a thread of this process. It does not allocate unless
// the name matches (the caller checks readerGate.inProgress first, so
// a mount that never stops pays one atomic load per request).
func isHandoverWakeInput(in []byte) bool {
	hs := int(unsafe.Sizeof(InHeader{}))
	if len(in) < hs+len(handoverWakeName)+1 {
		return false
	}
	h := (*InHeader)(unsafe.Pointer(&in[0]))
	if h.Opcode != _OP_LOOKUP || h.NodeId != FUSE_ROOT_ID {
		return false
	}
	name := in[hs:]
	if name[len(handoverWakeName)] != 0 || string(name[:len(handoverWakeName)]) != handoverWakeName {
		return false
	}
	return ownThread(h.Caller.Pid)
}

// ownThread reports whether tid, the pid of a FUSE request's caller,
// is a thread of this process. The kernel puts the calling thread's id
// there (not its thread group's), so a wake-up from any goroutine's
// thread is recognised through /proc/self/task. It assumes the mount's
// pid namespace is this process's, as it is for a mount this process
// or its parent made.
func ownThread(tid uint32) bool {
	if tid == 0 {
		return false
	}
	if int(tid) == os.Getpid() {
		return true
	}
	var st syscall.Stat_t
	return syscall.Stat("/proc/self/task/"+strconv.FormatUint(uint64(tid), 10), &st) == nil
}

// readerGate parks a server's readers for a handover. The zero value
// lets them run.
type readerGate struct {
	// stopping is read by every reader before and after each read.
	// It stays set from StopReading until Serve has parked and a
	// ResumeReading lets it go: a handler still running when a stop
	// times out must finish before anything is resent, or the kernel
	// would queue its request again and it would run twice.
	stopping atomic.Bool

	mu      sync.Mutex
	parked  chan struct{} // closed when Serve has parked
	decided chan bool     // true: read again; false: detach
	// decision is what this stop has been given (ResumeReading,
	// Detach or StopReading's time-out), so that a second one is
	// refused rather than blocking on decided.
	decision gateDecision

	// wakes counts the wake-up lookups not yet answered.
	wakes atomic.Int32
}

type gateDecision int

const (
	undecided gateDecision = iota
	resuming
	detached
)

func (d gateDecision) String() string {
	switch d {
	case resuming:
		return "resuming"
	case detached:
		return "detached"
	}
	return "undecided"
}

// inProgress reports whether a stop is under way or a wake-up lookup
// of one is still outstanding: the only time a reader intercepts the
// reserved name.
func (g *readerGate) inProgress() bool {
	return g.stopping.Load() || g.wakes.Load() > 0
}

// park runs in Serve once all readers have returned. It reports
// parked=false if they returned because the connection ended; else it
// waits for ResumeReading (resume=true) or Detach.
func (g *readerGate) park() (resume, parked bool) {
	g.mu.Lock()
	if !g.stopping.Load() {
		g.mu.Unlock()
		return false, false
	}
	close(g.parked)
	decided := g.decided
	g.mu.Unlock()
	return <-decided, true
}

// handleWhileStopping disposes of a request read after StopReading.
// Those that expect no answer are handled, since the kernel will not
// send them again (a FORGET dropped here would leak a lookup count in
// the successor), and so is a wake-up lookup; the others are left
// unanswered and the kernel resends them on FUSE_NOTIFY_RESEND.
func (ms *Server) handleWhileStopping(req *requestAlloc) {
	h := (*InHeader)(unsafe.Pointer(&req.inputBuf[0]))
	switch h.Opcode {
	case _OP_FORGET, _OP_BATCH_FORGET, _OP_NOTIFY_REPLY, _OP_LOOKUP:
		if h.Opcode != _OP_LOOKUP || isHandoverWakeInput(req.inputBuf) {
			ms.handleRequest(req)
			return
		}
	}
	if ms.opts.Debug {
		ms.opts.Logger.Printf("stopping: leaving %s unique %d for the successor", operationName(h.Opcode), h.Unique)
	}
	ms.fuseFD.returnRequest(req)
}

// StopReading makes the server stop reading requests without closing
// its fd or unmounting, so that the connection can be handed to a
// successor. It returns once every reader has returned and every
// request being handled has been answered. Requests read during the
// stop are left unanswered: the successor's NotifyResend, or
// ResumeReading, has the kernel send them again. It needs a kernel
// with FUSE_HAS_RESEND.
//
// After it, call Detach once the successor serves, or ResumeReading
// if it failed.
//
// After timeout it returns ErrStopTimeout and the stop turns into a
// resume: the server keeps the readers stopped until the handlers
// still running have answered, then asks for the resend and reads
// again, by itself (ResumeReading and Detach are refused meanwhile).
// Resending earlier would have the kernel queue those handlers'
// requests again, and run them twice.
func (ms *Server) StopReading(timeout time.Duration) error {
	if !ms.serving.Load() {
		return fmt.Errorf("fuse: StopReading before Serve")
	}
	if !ms.SupportsResend() {
		return fmt.Errorf("fuse: the kernel did not offer FUSE_HAS_RESEND: a request read during the stop would be lost")
	}
	if ms.mountPoint == "" || parseFuseFd(ms.mountPoint) >= 0 {
		return fmt.Errorf("fuse: StopReading needs the mount point, to wake the readers through it (mounted as %q)", ms.mountPoint)
	}
	g := &ms.gate
	g.mu.Lock()
	if g.stopping.Load() {
		g.mu.Unlock()
		return fmt.Errorf("fuse: StopReading while stopped")
	}
	parked := make(chan struct{})
	g.parked = parked
	g.decided = make(chan bool, 1)
	g.decision = undecided
	g.stopping.Store(true)
	g.mu.Unlock()

	// A reader blocked in read(2) sees the stop only when it reads
	// something: wake them one by one, while any is blocked.
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	ms.wakeBlockedReader()
	for {
		select {
		case <-parked:
			return nil
		case <-tick.C:
			ms.wakeBlockedReader()
		case <-deadline.C:
			if err := ms.decide(resuming); err != nil {
				// A concurrent ResumeReading or Detach
				// decided first: it has the stop now.
				return fmt.Errorf("%w; %v", ErrStopTimeout, err)
			}
			go func() {
				if err := ms.resumeWhenParked(parked); err != nil {
					ms.opts.Logger.Printf("fuse: resuming after a stop time-out: %v", err)
				}
			}()
			return ErrStopTimeout
		}
	}
}

// decide records d as the outcome of the current stop, refusing a
// second one.
func (ms *Server) decide(d gateDecision) error {
	g := &ms.gate
	g.mu.Lock()
	defer g.mu.Unlock()
	if !g.stopping.Load() {
		return fmt.Errorf("fuse: not stopped")
	}
	if g.decision != undecided {
		return fmt.Errorf("fuse: the stop is already %v", g.decision)
	}
	g.decision = d
	return nil
}

// resumeWhenParked waits for Serve to park, waking blocked readers
// meanwhile, then lets the readers read again and asks the kernel to
// resend what they left unanswered. No handler runs by then, so no
// request can be resent while it is still being handled.
func (ms *Server) resumeWhenParked(parked <-chan struct{}) error {
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case <-parked:
			break wait
		case <-tick.C:
			ms.wakeBlockedReader()
		}
	}
	g := &ms.gate
	g.mu.Lock()
	g.stopping.Store(false)
	decided := g.decided
	g.mu.Unlock()
	// The readers are parked: the resend queues the requests they
	// left before any of them reads again.
	st := ms.NotifyResend()
	decided <- true
	if !st.Ok() {
		return fmt.Errorf("fuse: NOTIFY_RESEND: %v", st)
	}
	return nil
}

// wakeBlockedReader wakes a reader blocked in read(2), if any is, by
// looking up handoverWakeName in the mount's root. There is no request
// a server can make the kernel send it directly on any kernel
// (NOTIFY_RETRIEVE, which queues one, is refused for directories, and
// the root is the one node every mount has), nor a signal that
// interrupts the read: the Go runtime installs its handlers with
// SA_RESTART.
//
// The lookup goes through the mount point's path: if the mount point
// is moved or shadowed by another mount during a stop, the wake-ups
// miss and StopReading times out (it never answers a stranger's
// request instead).
//
// A wake-up may stall before its LOOKUP (its path walk's GETATTR can
// be the request a stopping reader leaves for the successor, which
// wakes that reader all the same), so StopReading sends one per tick
// while a reader is blocked, up to maxWakes outstanding.
func (ms *Server) wakeBlockedReader() {
	r := ms.fuseFD
	r.reqMu.Lock()
	blocked := r.reqReaders > 0
	r.reqMu.Unlock()
	g := &ms.gate
	if !blocked || g.wakes.Load() >= maxWakes {
		return
	}
	g.wakes.Add(1)
	name := filepath.Join(ms.mountPoint, handoverWakeName)
	// The lookup may wait on other requests of its path walk (a
	// GETATTR for the permission check) that a stopping reader
	// leaves for the successor: let it wait in its own goroutine.
	go func() {
		defer g.wakes.Add(-1)
		var st syscall.Stat_t
		if err := syscall.Lstat(name, &st); err != syscall.ENOENT && ms.opts.Debug {
			ms.opts.Logger.Printf("stopping: wake-up lookup %s: %v", name, err)
		}
	}()
}

// ResumeReading undoes StopReading, for a handover whose successor
// failed: it waits for the handlers still running to answer (waking
// the readers blocked in read(2)), then the server reads again, after
// asking the kernel to resend what its readers left unanswered. It is
// refused after Detach, after another ResumeReading, and after a
// StopReading that timed out (that one resumes by itself).
//
// If the successor served requests, it handed out node ids and file
// handles this server does not know: package fs's ExportState moves
// the exporter's counters out of the successor's range, so they are
// never reissued for another file, and the kernel's requests for them
// get ESTALE.
func (ms *Server) ResumeReading() error {
	if err := ms.decide(resuming); err != nil {
		return fmt.Errorf("fuse: ResumeReading: %w", err)
	}
	g := &ms.gate
	g.mu.Lock()
	parked := g.parked
	g.mu.Unlock()
	return ms.resumeWhenParked(parked)
}

// Detach ends a stopped server without unmounting: Serve returns
// without calling OnUnmount, the server's fd is closed (the successor
// holds its own) and Unmount becomes a no-op. It waits for Serve to
// park, at most timeout.
func (ms *Server) Detach(timeout time.Duration) error {
	g := &ms.gate
	g.mu.Lock()
	if !g.stopping.Load() {
		g.mu.Unlock()
		return fmt.Errorf("fuse: Detach without StopReading")
	}
	parked := g.parked
	g.mu.Unlock()
	select {
	case <-parked:
	case <-time.After(timeout):
		return fmt.Errorf("fuse: Detach: the server did not park within %v", timeout)
	}
	if err := ms.decide(detached); err != nil {
		return fmt.Errorf("fuse: Detach: %w", err)
	}
	ms.mountPoint = ""
	g.decided <- false
	return nil
}
