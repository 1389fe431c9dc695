package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/fusefs"
	"github.com/alkblobfs/alkblobfs/ops"
)

func newMountCmd(a *app) *cobra.Command {
	var (
		sched      upkeepFlags
		receiptTTL time.Duration
		verify     string
		allowOther bool
		debug      bool
		pass       bool
		ro         bool
		maxRcpt    int
		daemon     bool
		logFile    string
		nonEmpty   bool
		cpuProfile string
		memProfile string
		heapTarget heapTargetValue = defaultHeapTarget
		listen     string
		insecure   bool
		permTTL    time.Duration
		tokenTTL   time.Duration
		source     string
		restart    bool
	)
	cmd := &cobra.Command{
		Use:         "mount MOUNTPOINT",
		Annotations: logDefault,
		Short:       "Mount the store as a filesystem (runs in the foreground)",
		Long: `mount serves the store at MOUNTPOINT until interrupted (SIGINT, SIGTERM) or
until someone runs umount on it.

  /<namespace>/            mkdir makes one, rmdir removes an empty one
  /<namespace>/<digest>    a blob: read-only, named by its sha256
  /<namespace>/incoming/   copy files here (cp, rsync, tar, dd, >): each is
                           published into the namespace when closed, and the
                           name stays as a read-only receipt for --receipt-ttl
  /.alkblobfs/sweep        write "run" to sweep now; read the last report
  /.alkblobfs/sweep-timer  write off, on (resumes the last interval; 15m if
                           there was none) or a duration of at least 1s
  /.alkblobfs/scrub        write "run" to re-verify every blob now; read the
                           last report
  /.alkblobfs/stats        counters as JSON

A control file takes one command per open, in one write at offset 0, with
at most one trailing newline (echo's); a duration is unsigned, each unit
(h, m, s, ms, us, ns) once and in that order: 15m, 1h30m, 1.5h. Anything
else (0, an empty line, " 1h", +5m, 5m5m, a second line) is EINVAL and
changes nothing. ": > file" or a truncate is no command.

Reads are checked against the digest in one of three modes:

  --verify=full     (the default) every read through the daemon checks the
                    64 KiB chunks it touches. The kernel reads a local blob's
                    file directly (FUSE passthrough) only after the blob was
                    verified end to end, and only while the file keeps the
                    device, inode, size, mtime and ctime it had then: a file
                    written to or replaced since is verified again first.
                    Damage that leaves the metadata alone (bit rot) is not
                    seen by passthrough reads: a scrub finds it.
  --verify=strict   every open reads through the daemon, which checks every
                    chunk it serves, and a read of the whole blob also
                    checks its sha256 before the end; no passthrough, no
                    page cache kept between opens.
  --verify=publish  trusts the hashing done when the blob was stored: no
                    read is checked, and local blobs pass through at once.

A blob that fails a check is EIO and a log line naming its digest, never
wrong bytes. --scrub-every re-reads the whole store from disk on a timer, at
most --scrub-rate MB/s; a local blob it finds corrupt is EIO at open from
then on (in every mode), until its file is restored.

Memory: the daemon keeps a node of about 490 bytes for every entry the
kernel has looked up (ls -l of 100 000 blobs leaves some 50 MiB), until
the kernel forgets it. It collects garbage early enough that its Go heap
stays under --heap-target (default 64 MiB; the RSS adds about 25 MiB) while
that is cheap: the heap may always grow by a quarter of what is live
between collections, so a larger live heap goes over the target rather
than be collected back to back. GOGC in the environment turns this off.

A stale mount left by a daemon that was killed is unmounted lazily first.
As root the mount uses mount(2) directly; otherwise fusermount3.

--restart-on-crash (as root): when the daemon dies (kill -9, out of
memory), its guard starts it again on the live connection instead of
leaving the mount dead: programs keep the mount, their working
directories and new opens work at once, and a file opened before gets
ESTALE at its next request to the daemon (never another file's bytes).
What the daemon had not made durable follows the crash rules of
docs/publish.md. A third crash within a minute ends the mount as without
the flag (ENOTCONN until it is mounted again).`,
		Example: `  alkblobfs mount /mnt/blobs
  alkblobfs --data /srv/blobs mount --sweep-every 1h /mnt/blobs
  alkblobfs --kv mem: --large mem: mount --verify=publish /tmp/scratch`,
		Args: argsRange(1, 1, "MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) (err error) {
			v, err := fusefs.ParseVerify(verify)
			if err != nil {
				return usage(cmd, err)
			}
			rate, err := sched.check(cmd, ro)
			if err != nil {
				return err
			}
			if maxRcpt <= 0 {
				return usagef(cmd, "--max-receipts %d: must be positive", maxRcpt)
			}
			if receiptTTL <= 0 {
				return usagef(cmd, "--receipt-ttl %s: must be positive", receiptTTL)
			}
			if cmd.Flags().Changed("source") {
				if err := checkSource(source); err != nil {
					return usage(cmd, err)
				}
			}
			child := daemonChild()
			// Started by `alkblobfs upgrade` of a daemon serving the
			// mountpoint: take its mount over instead of mounting.
			tk, err := takeoverChild()
			if err != nil {
				return err
			}
			// Started by the mount's guard after the daemon crashed:
			// serve the live connection it kept.
			rs, err := fusefs.RestartedFromEnv()
			if err != nil {
				return err
			}
			if daemon && child == nil && tk == nil && rs == nil {
				// The parent: start the daemon and wait until it serves.
				if logFile == "" {
					if logFile = defaultLogFile(a.data); logFile == "" {
						return usagef(cmd, "--daemon logs to a file: give --log-file (there is no data directory to keep it in)")
					}
				}
				return spawnDaemon(cmd.Context(), logFile)
			}
			defer func() { child.failed(err) }()
			// A daemon says what it is doing: info unless asked otherwise
			// (commandLogLevel), debug with --debug.
			out := a.stderr
			if logFile != "" && child == nil {
				lf, err := os.OpenFile(logFile, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
				if err != nil {
					return fmt.Errorf("--log-file: %w", err)
				}
				defer lf.Close()
				out = lf
			}
			lg := a.log
			if debug || out != a.stderr {
				lvl := slog.Level(a.logLevel)
				if debug {
					lvl = slog.LevelDebug
				}
				lg = slog.New(slog.NewTextHandler(out, &slog.HandlerOptions{Level: lvl}))
			}
			a.log = lg // the store and engines log where the mount does
			tk.step(stepStarted)
			defer paceHeap(uint64(heapTarget))()
			if cpuProfile != "" {
				stop, err := startCPUProfile(cpuProfile)
				if err != nil {
					return err
				}
				defer stop()
			}
			ctx := cmd.Context()
			// The HTTP surface's address is checked before anything mounts.
			var ln net.Listener
			var toks *ops.Tokens
			if insecure && listen == "" {
				return usagef(cmd, "--insecure-loopback goes with --listen HOST:PORT")
			}
			if listen != "" {
				if tokenTTL <= 0 {
					return usagef(cmd, "--token-ttl %s: must be positive", tokenTTL)
				}
				// A takeover gets its predecessor's socket later, with
				// the mount.
				if tk == nil {
					if ln, toks, err = a.listen(cmd, listen, insecure, allowOther, rs != nil, nil); err != nil {
						return err
					}
				}
			}
			defer func() {
				if ln != nil {
					ln.Close()
				}
			}()
			// The store, with its namespaces registry registered as a
			// liveness source (registerSources). A store that cannot keep
			// namespaces cannot be mounted: a usage error naming why.
			st, svc, err := a.openNamespaces(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			if !ro && !st.ReadOnly() {
				a.fillSizes(cmd.Context(), svc)
			}
			var metrics *ops.Metrics
			var observe func(string, time.Duration)
			if listen != "" {
				metrics = ops.NewMetrics(st)
				observe = metrics.ObserveFUSE
			}
			dataDir := "" // the "mounted" log line names it
			if a.data != "" {
				dataDir = resolvePath(a.data)
			}
			cfg := fusefs.Config{
				Store:         st,
				Namespaces:    svc.Registry,
				Verify:        v,
				ReceiptTTL:    receiptTTL,
				MaxReceipts:   maxRcpt,
				SweepEvery:    sched.sweepEvery,
				ScrubEvery:    sched.scrubEvery,
				ScrubRate:     rate,
				AllowOther:    allowOther,
				Debug:         debug,
				NoPassthrough: !pass,
				ReadOnly:      ro,
				NonEmpty:      nonEmpty,
				Source:        a.mountSource(st, source),
				Data:          dataDir,
				Logger:        lg,
				Observe:       observe,
				// A restarted daemon's guard is the one that restarted it.
				Guard:          rs == nil,
				RestartOnCrash: restart,
			}
			var srv *fusefs.Server
			if tk != nil {
				srv, err = tk.run(cfg, lg)
				if err == nil && listen != "" {
					ln, toks, err = a.listen(cmd, listen, insecure, allowOther, false, tk.http())
				}
			} else if rs != nil {
				lg.Warn("restarting after a crash: descriptors opened before answer ESTALE", "restart", rs.Generation())
				srv, err = fusefs.Restart(rs, cfg)
			} else {
				srv, err = fusefs.Mount(args[0], cfg)
			}
			if err != nil {
				return err
			}
			ctl, err := startControl(srv, tk.ctl(), ln, lg, rs != nil)
			if err != nil {
				lg.Warn("no control socket: alkblobfs upgrade cannot reach this mount", "err", err)
			}
			stopHTTP := func() {}
			if ln != nil {
				metrics.AttachMount(func() ops.MountStats { return mountStats(srv.Counters()) })
				metrics.AttachUpkeep(srv.Upkeep())
				oc := a.opsConfig(st, svc, toks, insecure, tokenTTL, lg)
				oc.Metrics, oc.ReadOnly = metrics, ro
				oc.Upkeep = srv.Upkeep()
				oc.PermTTL = permTTL
				stopHTTP = serveBeside(ctx, ops.New(oc), ln, lg)
				defer stopHTTP()
				defer reloadOnHangup(ctx, toks, lg)()
				lg.Info("serving HTTP beside the mount", "url", listenURL(ln), "tokens", toks.Len())
			}
			if tk == nil && rs == nil {
				if err := sdNotify("READY=1\nSTATUS=serving " + srv.Dir()); err != nil {
					lg.Warn("could not tell the service manager that the mount is ready", "err", err)
				}
			}
			child.ready()
			select {
			case <-ctx.Done():
				sdNotify("STOPPING=1")
				if memProfile != "" {
					if err := writeHeapProfile(memProfile); err != nil {
						lg.Warn("could not write the heap profile", "err", err)
					}
				}
				lg.Info("signal received; unmounting (a second signal exits at once)", "mountpoint", srv.Dir())
				ctl.close(false)
				if err := srv.Unmount(); err != nil {
					return err
				}
			case <-srv.Done():
				if srv.HandedOver() {
					// A successor serves the mount, its sockets and the
					// service manager's main pid: leave them to it once
					// the upgrade's answer is out.
					ctl.close(true)
					if u, ok := ln.(*net.UnixListener); ok {
						u.SetUnlinkOnClose(false)
					}
					stopHTTP()
					return st.Close()
				}
				// umount by someone else.
				sdNotify("STOPPING=1")
				ctl.close(false)
			}
			stopHTTP()
			return st.Close()
		},
	}
	f := cmd.Flags()
	sched.register(f, "; change it later in .alkblobfs/sweep-timer")
	f.BoolVar(&allowOther, "allow-other", false, "let other users use the mount; the kernel then checks each namespace's owner, group and mode")
	f.BoolVar(&debug, "debug", false, "log every FUSE request (at debug level)")
	f.StringVar(&verify, "verify", string(fusefs.VerifyFull), "read verification: full, strict or publish (see above)")
	f.DurationVar(&receiptTTL, "receipt-ttl", fusefs.DefaultReceiptTTL, "how long incoming/ keeps a name after its file was published (empty directories there go after as long)")
	f.IntVar(&maxRcpt, "max-receipts", fusefs.DefaultMaxReceipts, "most names incoming/ keeps after publish, in all namespaces; past it the oldest go first (each costs about 2.5 KiB of daemon memory: 100000 stay under 320 MiB)")
	f.BoolVar(&ro, "read-only", false, "mount read-only: reads and pins only, every change is EROFS (beside a read-write mount of the same store, say)")
	f.BoolVar(&daemon, "daemon", false, "detach once the mount serves (the command returns then, non-zero if it could not mount); log to --log-file")
	f.StringVar(&logFile, "log-file", "", "append the daemon's log to this file (default with --daemon: mount.log in the data directory, or a state directory when that is read-only)")
	f.BoolVar(&nonEmpty, "nonempty", false, "mount over a directory that holds files (hidden while mounted)")
	f.BoolVar(&pass, "passthrough", true, "let the kernel read local blobs directly where it can (FUSE passthrough)")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the daemon to this file (for go tool pprof)")
	f.MarkHidden("cpuprofile")
	f.Var(&heapTarget, "heap-target", "the Go heap the daemon collects garbage to stay under, while that costs at most four times Go's default collection work (0: Go's default; see above)")
	f.StringVar(&memProfile, "memprofile", "", "write a heap profile of the daemon to this file when it is told to stop, before it unmounts (for go tool pprof)")
	f.MarkHidden("memprofile")
	f.StringVar(&listen, "listen", "", "also serve the HTTP surface (see alkblobfs serve --help) at `ADDR`, with the mount's counters and FUSE latencies in /metrics: unix: (the default socket), unix:PATH, or HOST:PORT with --auth-token-file (default off)")
	f.BoolVar(&insecure, "insecure-loopback", false, "with --listen on loopback: no tokens, every local user acts as the mounting user (refused with --allow-other)")
	permCacheFlag(f, &permTTL)
	f.DurationVar(&tokenTTL, "token-ttl", ops.DefaultTokenTTL, "with --listen: life of a put's pin token after the put or its last renewal")
	f.BoolVar(&restart, "restart-on-crash", false, "when the daemon dies, restart it on the live connection instead of leaving the mount dead (as root; see above)")
	f.StringVar(&source, "source", "", "what the mount shows as its source in /proc/mounts, findmnt and df (default: the data directory, or the kv engine's URL without its password when no tier is there); the fstab helper passes the line's SOURCE")
	return cmd
}

// mountStats is the part of a mount's stats the metrics show.
func mountStats(s fusefs.Stats) ops.MountStats {
	return ops.MountStats{
		OpenHandles: s.OpenHandles, OpenDigests: int64(s.OpenDigests), Receipts: s.Receipts,
		UploadsInFlight: int64(s.UploadsInFlight), Opens: s.Opens, Reads: s.Reads, BytesRead: s.BytesRead,
		Writes: s.Writes, BytesWritten: s.BytesWritten, Publishes: s.Publishes,
		PublishFailures: s.PublishFailures, VerifyFailures: s.VerifyFailures,
		CrashRestarts: int64(s.CrashRestarts),
	}
}

// writeHeapProfile writes the live heap, after a collection, to path. It
// runs when the daemon is told to stop and before the unmount tears the
// node tree down, so it shows what the mount held while it served (the
// inodes of everything the kernel had looked up).
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	runtime.GC()
	if err := pprof.WriteHeapProfile(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// startCPUProfile profiles the daemon until the returned stop runs.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}
