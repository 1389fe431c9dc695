package main

import (
	"log/slog"
	"os"
	"runtime/pprof"
	"time"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/fusefs"
)

func newMountCmd(a *app) *cobra.Command {
	var (
		sweepEvery time.Duration
		receiptTTL time.Duration
		verify     string
		allowOther bool
		debug      bool
		pass       bool
		ro         bool
		maxRcpt    int
		cpuProfile string
	)
	cmd := &cobra.Command{
		Use:   "mount MOUNTPOINT",
		Short: "Mount the store as a filesystem (runs in the foreground)",
		Long: `mount serves the store at MOUNTPOINT until interrupted (SIGINT, SIGTERM) or
until someone runs umount on it.

  /<namespace>/            mkdir makes one, rmdir removes an empty one
  /<namespace>/<digest>    a blob: read-only, named by its sha256
  /<namespace>/incoming/   copy files here (cp, rsync, tar, dd, >): each is
                           published into the namespace when closed, and the
                           name stays as a read-only receipt for --receipt-ttl
  /.alkblobfs/sweep        write "run" to sweep now; read the last report
  /.alkblobfs/sweep-timer  write off, on or a duration like 15m
  /.alkblobfs/stats        counters as JSON

With --verify=full (the default) no byte is served unverified: range reads
check what they touch, and the kernel reads a local blob directly (FUSE
passthrough) only once it has been verified end to end. --verify=publish
trusts the hashing done when blobs were stored and passes local blobs
through from the first read.

A stale mount left by a daemon that was killed is unmounted lazily first.
As root the mount uses mount(2) directly; otherwise fusermount3.`,
		Example: `  alkblobfs mount /mnt/blobs
  alkblobfs --data /srv/blobs mount --sweep-every 1h /mnt/blobs
  alkblobfs --kv mem: --large mem: mount --verify=publish /tmp/scratch`,
		Args: argsRange(1, 1, "MOUNTPOINT"),
		RunE: func(cmd *cobra.Command, args []string) error {
			v, err := fusefs.ParseVerify(verify)
			if err != nil {
				return usage(cmd, err)
			}
			if err := fusefs.CheckSweepEvery(sweepEvery, ro); err != nil {
				return usagef(cmd, "--sweep-every: %v", err)
			}
			if maxRcpt <= 0 {
				return usagef(cmd, "--max-receipts %d: must be positive", maxRcpt)
			}
			if receiptTTL <= 0 {
				return usagef(cmd, "--receipt-ttl %s: must be positive", receiptTTL)
			}
			// A daemon says what it is doing: info unless asked otherwise
			// (debug with --debug, which logs at debug level).
			lg := a.log
			if f := cmd.Flag("log-level"); f == nil || !f.Changed {
				lvl := slog.LevelInfo
				if debug {
					lvl = slog.LevelDebug
				}
				lg = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: lvl}))
			}
			if cpuProfile != "" {
				stop, err := startCPUProfile(cpuProfile)
				if err != nil {
					return err
				}
				defer stop()
			}
			ctx := cmd.Context()
			// The store, with its namespaces registry registered as a
			// liveness source (registerSources). A store that cannot keep
			// namespaces cannot be mounted: a usage error naming why.
			st, svc, err := a.openNamespaces(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			srv, err := fusefs.Mount(args[0], fusefs.Config{
				Store:         st,
				Namespaces:    svc.Registry,
				Verify:        v,
				ReceiptTTL:    receiptTTL,
				MaxReceipts:   maxRcpt,
				SweepEvery:    sweepEvery,
				AllowOther:    allowOther,
				Debug:         debug,
				NoPassthrough: !pass,
				ReadOnly:      ro,
				Logger:        lg,
			})
			if err != nil {
				return err
			}
			if err := sdNotify("READY=1\nSTATUS=serving " + srv.Dir()); err != nil {
				lg.Warn("could not tell the service manager that the mount is ready", "err", err)
			}
			select {
			case <-ctx.Done():
				sdNotify("STOPPING=1")
				lg.Info("signal received; unmounting (a second signal exits at once)", "mountpoint", srv.Dir())
				if err := srv.Unmount(); err != nil {
					return err
				}
			case <-srv.Done():
				// umount by someone else.
				sdNotify("STOPPING=1")
			}
			return st.Close()
		},
	}
	f := cmd.Flags()
	f.DurationVar(&sweepEvery, "sweep-every", 0, "sweep on a timer, e.g. 1h (0: off; change it later in .alkblobfs/sweep-timer)")
	f.BoolVar(&allowOther, "allow-other", false, "let other users use the mount (they can then do anything the owner can)")
	f.BoolVar(&debug, "debug", false, "log every FUSE request (at debug level)")
	f.StringVar(&verify, "verify", string(fusefs.VerifyFull), "read verification: full (never serve unverified bytes) or publish (trust publish-time hashing)")
	f.DurationVar(&receiptTTL, "receipt-ttl", fusefs.DefaultReceiptTTL, "how long incoming/ keeps a name after its file was published (empty directories there go after as long)")
	f.IntVar(&maxRcpt, "max-receipts", fusefs.DefaultMaxReceipts, "most names incoming/ keeps after publish, in all namespaces; past it the oldest go first")
	f.BoolVar(&ro, "read-only", false, "mount read-only: reads and pins only, every change is EROFS (beside a read-write mount of the same store, say)")
	f.BoolVar(&pass, "passthrough", true, "let the kernel read local blobs directly where it can (FUSE passthrough)")
	f.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the daemon to this file (for go tool pprof)")
	f.MarkHidden("cpuprofile")
	return cmd
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
