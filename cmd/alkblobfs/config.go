package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"

	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/cache"
	"github.com/alkblobfs/alkblobfs/engines/local"
	"github.com/alkblobfs/alkblobfs/engines/mem"
	"github.com/alkblobfs/alkblobfs/engines/pglo"
	"github.com/alkblobfs/alkblobfs/engines/postgres"
	"github.com/alkblobfs/alkblobfs/engines/s3"
	"github.com/alkblobfs/alkblobfs/engines/sqlite"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// defaultDataDir is $XDG_DATA_HOME/alkblobfs, else ~/.local/share/alkblobfs.
// It is "" when neither can be found; opening a store then asks for --data.
// dataSource names what set the data directory, for messages.
func (a *app) dataSource(cmd *cobra.Command) string {
	switch {
	case cmd.Flags().Changed("data"):
		return "set by --data"
	case os.Getenv(envName("data")) != "":
		return "set by " + envName("data")
	}
	return "the default, under $XDG_DATA_HOME or ~/.local/share; set another with --data"
}

func defaultDataDir() string {
	if x := os.Getenv("XDG_DATA_HOME"); filepath.IsAbs(x) {
		return filepath.Join(x, "alkblobfs")
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return ""
	}
	return filepath.Join(home, ".local", "share", "alkblobfs")
}

// open builds the store from the global flags and registers the liveness
// sources. The caller closes it.
func (a *app) open(cmd *cobra.Command) (*store.Store, error) {
	st, _, err := a.openNS(cmd)
	return st, err
}

// openNS is open that also returns the namespaces service registered as a
// liveness source, or nil when the store keeps no namespaces (see
// registerSources).
func (a *app) openNS(cmd *cobra.Command) (*store.Store, *namespaces.Service, error) {
	st, _, svc, err := a.openStore(cmd)
	if err == nil {
		a.noteMem()
	}
	return st, svc, err
}

// noteMem tells, at info, that a mem: engine forgets at exit.
func (a *app) noteMem() {
	if a.memEngine {
		a.log.Info("a mem: engine keeps blobs only until this command exits")
	}
}

// openStore is openNS that also returns the configuration the store was
// opened on: its engines, which the store does not hand out, for what
// must live in the kv engine's own database (namespaces, liveness
// tables).
func (a *app) openStore(cmd *cobra.Command) (*store.Store, store.Config, *namespaces.Service, error) {
	ctx := cmd.Context()
	cfg, err := a.storeConfig(cmd)
	if err != nil {
		return nil, cfg, nil, err
	}
	st, err := store.Open(ctx, cfg)
	if err != nil {
		closeEngines(cfg)
		if errors.Is(err, store.ErrFleetConfig) {
			return nil, cfg, nil, usage(cmd, err)
		}
		return nil, cfg, nil, err
	}
	if st.ReadOnly() && cmd.Annotations[annWrites] != "" {
		st.Close()
		where := "its data is"
		if a.kv == "" && a.kvFile == "" || a.large == "" {
			where = fmt.Sprintf("its data directory %s (%s) is", a.data, a.dataSource(cmd))
		}
		return nil, cfg, nil, fmt.Errorf("%s changes the store: %w: %s on a read-only filesystem, or not writable by this user; get, cat, ls, stat, verify and mount --read-only still work",
			cmd.CommandPath(), store.ErrReadOnly, where)
	}
	svc, err := registerSources(ctx, st, cfg)
	if err == nil {
		err = a.registerTables(cmd, st, cfg)
	}
	if err != nil {
		st.Close()
		return nil, cfg, nil, err
	}
	if svc != nil && !st.ReadOnly() && cmd.Annotations[annWrites] != "" {
		// A dead writer's closed files, once its lease lapsed, are linked
		// by the next process that writes the store (publish.md): this
		// command too, a command that writes (sweep, put, rm, ns
		// create/rm/link/unlink), before it does. A read command (ls,
		// stat, cat, get, have, verify) settles nothing: settling is a
		// write transaction, which would queue it behind a sweep and
		// compete with mounts for the write lock. A failure only delays
		// them to the next writer.
		if n, err := svc.SettleLapsed(ctx); err != nil {
			a.log.Warn("could not publish the files a dead writer closed; the next process that opens the store will", "err", err)
		} else if n > 0 {
			a.log.Info("published files whose close succeeded before their writer died", "files", n)
		}
		a.fillSizes(ctx, svc)
	}
	a.log.Debug("store open", "mode", st.Mode(), "threshold", st.Threshold(), "kv", engineName(cfg.KV), "large", engineName(cfg.Large), "namespaces", svc != nil)
	return st, cfg, svc, nil
}

// writes annotates the commands that change the store: on read-only
// media they fail at once with a clear error.
var writes = map[string]string{annWrites: "true"}

const annWrites = "alkblobfs.writes"

func closeEngines(cfg store.Config) {
	if cfg.KV != nil {
		cfg.KV.Close()
	}
	if cfg.Large != nil {
		cfg.Large.Close()
	}
}

func engineName(e engines.Engine) string {
	if e == nil {
		return "none"
	}
	return e.Name()
}

// tierRole says which tier an engine URL is for.
type tierRole string

const (
	roleKV    tierRole = "kv"
	roleLarge tierRole = "large"
)

// storeConfig turns --kv, --large, --threshold and --gc-window into a
// store.Config with its engines open. Mistakes in the URLs are usage
// errors; failures opening an engine are not.
func (a *app) storeConfig(cmd *cobra.Command) (store.Config, error) {
	ctx := cmd.Context()
	cfg := store.Config{Threshold: int64(a.threshold), GCDelay: a.gcWindow, Logger: a.log,
		PinTTL: a.pinTTL, Fleet: a.fleet, SharedMedia: a.shared, UploadMemory: int64(a.uploadMem)}
	// Scratch space for uploads (mem and pglo large tiers, or none) sits
	// with the store, private, not in the system's shared temp directory.
	if cfg.ScratchDir = a.scratch; cfg.ScratchDir == "" && a.data != "" {
		cfg.ScratchDir = filepath.Join(a.data, "scratch")
	}
	if a.pinTTL <= 0 {
		return cfg, usagef(cmd, "--pin-ttl %s: must be positive", a.pinTTL)
	}
	var err error
	if cfg.SyncEvery, err = syncEvery(); err != nil {
		return cfg, usage(cmd, err)
	}
	if cfg.Clock, err = processClock(); err != nil {
		return cfg, usage(cmd, err)
	}
	if a.shared && !a.fleet {
		return cfg, usagef(cmd, "--shared-media declares a fleet's storage: use it with --fleet")
	}
	if _, err := gc.VisibleAfter(time.Now(), a.gcWindow); err != nil {
		return cfg, usagef(cmd, "--gc-window %s: %v", a.gcWindow, err)
	}
	kvURL, largeURL := a.kv, a.large
	if a.kvFile != "" {
		if kvURL != "" {
			return cfg, usagef(cmd, "--kv and --kv-file both name the kv engine: give one")
		}
		b, err := os.ReadFile(a.kvFile)
		if err != nil {
			return cfg, usagef(cmd, "--kv-file: %v", err)
		}
		line, _, _ := strings.Cut(string(b), "\n")
		if kvURL = strings.TrimSpace(line); kvURL == "" {
			return cfg, usagef(cmd, "--kv-file %s: empty", a.kvFile)
		}
	}
	if kvURL == "" || largeURL == "" {
		a.inData = true
		if a.data == "" {
			return cfg, usagef(cmd, "no data directory: set --data, $XDG_DATA_HOME or $HOME")
		}
		if kvURL == "" {
			kvURL = "sqlite:" + filepath.Join(a.data, "kv.db")
		}
		if largeURL == "" {
			largeURL = "local:" + filepath.Join(a.data, "large")
		}
		// A regular file is not a directory, whoever asks (access(2) would
		// say EACCES to root, for want of an x bit).
		if fi, err := os.Stat(a.data); err == nil && !fi.IsDir() {
			return cfg, fmt.Errorf("data directory %s (%s): %w", a.data, a.dataSource(cmd), unix.ENOTDIR)
		}
		if err := unix.Access(a.data, unix.R_OK|unix.X_OK); err != nil && !errors.Is(err, unix.ENOENT) {
			return cfg, fmt.Errorf("data directory %s (%s): %w", a.data, a.dataSource(cmd), err)
		}
		if fi, err := os.Stat(a.data); err == nil && fi.Mode().Perm()&0o077 != 0 {
			// The store's own files are private whatever the directory is;
			// its names (and anything else kept there) are not.
			a.log.Warn("the data directory is open to other users; the store keeps its files private, but consider chmod 700",
				"dir", a.data, "mode", fmt.Sprintf("%#o", fi.Mode().Perm()))
		}
	}
	if largeURL == "pglo" || largeURL == "pglo:" {
		// Large objects in the kv engine's database (one home for GC state).
		if !strings.HasPrefix(kvURL, "postgres://") && !strings.HasPrefix(kvURL, "postgresql://") {
			return cfg, usagef(cmd, "--large pglo shares the kv engine's database, so it needs --kv postgres://…; or use --large pglo:postgres://…")
		}
		largeURL = "pglo:" + kvURL
	}
	if kvURL == "none" && largeURL == "none" {
		return cfg, usagef(cmd, "--kv and --large are both none: a store needs at least one engine")
	}
	if err := a.cache.check(largeURL); err != nil {
		return cfg, usage(cmd, err)
	}
	kv, err := openEngine(ctx, roleKV, kvURL, a.log)
	if err != nil {
		return cfg, a.urlError(cmd, "--kv", err)
	}
	large, err := openEngine(ctx, roleLarge, largeURL, a.log)
	if err != nil {
		if kv != nil {
			kv.Close()
		}
		return cfg, a.urlError(cmd, "--large", err)
	}
	if kv != nil {
		cfg.KV = kv.(engines.KV) // openEngine checked the role
	}
	if large != nil {
		cfg.Large = large.(engines.Large)
	}
	if a.cache.dir != "" {
		c, _, err := cache.New(ctx, cfg.Large, cache.Options{Dir: a.cache.dir, Limit: int64(a.cache.size), Log: a.log})
		if err != nil {
			closeEngines(cfg)
			return cfg, err
		}
		cfg.Large = c
	}
	if large == nil && strings.HasPrefix(kvURL, "mem:") {
		cfg.Mode = store.ModeMemOnly
	}
	// Said once the store is open and the command goes ahead (noteMem):
	// a refusal is one line.
	a.memEngine = strings.HasPrefix(kvURL, "mem:") || strings.HasPrefix(largeURL, "mem:")
	return cfg, nil
}

func (a *app) urlError(cmd *cobra.Command, flag string, err error) error {
	var bad *badURLError
	if errors.As(err, &bad) {
		return usagef(cmd, "%s %q: %s", flag, bad.url, bad.msg)
	}
	return err
}

// badURLError is a malformed or unsupported engine URL: the user's mistake,
// so a usage error, unlike a failure to open a well-formed one.
type badURLError struct{ url, msg string }

func (e *badURLError) Error() string { return fmt.Sprintf("engine URL %q: %s", e.url, e.msg) }

// openEngine is the one place that maps an engine URL to an engine:
//
//	none          no engine for this tier (returns nil, nil)
//	mem:          in-memory, either tier (gone when the process exits)
//	sqlite:PATH   SQLite database file, kv tier
//	local:DIR     files under DIR, large tier
//	postgres://…  PostgreSQL database (URL or key=value DSN after "postgres:"), kv tier
//	pglo:DSN      PostgreSQL large objects in the database DSN names, large tier
//	s3://BUCKET/PREFIX?endpoint=HOST:PORT[&region=R][&tls=false]
//	              objects in an S3 bucket, large tier (credentials from
//	              AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or the AWS
//	              credentials file, never the URL)
//
// storeConfig turns a plain "pglo" into pglo:<the --kv URL>.
func openEngine(ctx context.Context, role tierRole, url string, log *slog.Logger) (engines.Engine, error) {
	scheme, rest, _ := strings.Cut(url, ":")
	var e engines.Engine
	switch scheme {
	case "none":
		if rest != "" || strings.Contains(url, ":") {
			return nil, &badURLError{url, "none takes no argument"}
		}
		return nil, nil
	case "mem":
		if rest != "" {
			return nil, &badURLError{url, "mem: takes no argument"}
		}
		e = mem.New()
	case "sqlite":
		if rest == "" {
			return nil, &badURLError{url, "want sqlite:PATH"}
		}
		if role != roleKV {
			return nil, &badURLError{url, "sqlite is a kv-tier engine; for --large use local:DIR or mem:"}
		}
		if err := os.MkdirAll(filepath.Dir(rest), 0o700); err != nil {
			return nil, err
		}
		s, err := sqlite.OpenLog(ctx, rest, log)
		if err != nil {
			return nil, err
		}
		e = s
	case "local":
		if rest == "" {
			return nil, &badURLError{url, "want local:DIR"}
		}
		if role != roleLarge {
			return nil, &badURLError{url, "local is a large-tier engine; for --kv use sqlite:PATH or mem:"}
		}
		if err := os.MkdirAll(rest, 0o700); err != nil {
			return nil, err
		}
		l, err := local.Open(ctx, rest, log)
		if err != nil {
			return nil, err
		}
		e = l
	case "postgres", "postgresql":
		if role != roleKV {
			return nil, &badURLError{postgres.Redact(url, url), "postgres is a kv-tier engine; for --large use pglo (same database as --kv) or pglo:postgres://…"}
		}
		p, err := postgres.Open(ctx, url)
		if err != nil {
			return nil, pgOpenError(url, err)
		}
		e = p
	case "pglo":
		if role != roleLarge {
			return nil, &badURLError{postgres.Redact(url, url), "pglo is a large-tier engine; for --kv use postgres://…"}
		}
		if rest == "" {
			return nil, &badURLError{url, "want pglo:postgres://USER@HOST:PORT/DB, or pglo alone with --kv postgres://…"}
		}
		l, err := pglo.Open(ctx, rest)
		if err != nil {
			return nil, pgOpenError(rest, err)
		}
		e = l
	case "s3":
		if role != roleLarge {
			return nil, &badURLError{s3.Redact(url), "s3 is a large-tier engine; for --kv use sqlite:PATH or postgres://…"}
		}
		cfg, err := s3.ParseURL(url)
		if err != nil {
			return nil, &badURLError{s3.Redact(url), err.Error()}
		}
		l, err := s3.Open(ctx, cfg, log)
		if err != nil {
			return nil, err
		}
		e = l
	default:
		// Redacted: a libpq key=value DSN lands here, password and all.
		return nil, &badURLError{postgres.Redact(url, url), "unknown engine; want mem:, sqlite:PATH, local:DIR, postgres://…, pglo[:postgres://…], s3://BUCKET/PREFIX?endpoint=HOST:PORT or none"}
	}
	_, isKV := e.(engines.KV)
	_, isLarge := e.(engines.Large)
	if role == roleKV && !isKV || role == roleLarge && !isLarge {
		e.Close()
		return nil, &badURLError{url, fmt.Sprintf("engine %s cannot serve the %s tier", e.Name(), role)}
	}
	return e, nil
}

// pgOpenError makes a DSN that does not parse a usage error (exit 2); a
// server that cannot be reached stays an operational one (exit 1). Both
// messages name the server and never the password.
func pgOpenError(dsn string, err error) error {
	if errors.Is(err, postgres.ErrBadDSN) {
		return &badURLError{postgres.Redact(dsn, dsn), err.Error()}
	}
	return err
}

// cacheFlags are --cache and --cache-size: a local cache of a remote
// large tier (engines/cache), shared by every process of the host that
// names the same directory.
type cacheFlags struct {
	dir  string
	size sizeValue
}

// defaultCacheSize bounds a cache given no --cache-size.
const defaultCacheSize = 10 << 30

func (c *cacheFlags) register(f *pflag.FlagSet) {
	c.size = defaultCacheSize
	f.StringVar(&c.dir, "cache", "", "keep local copies of the s3:// or pglo large tier's blobs in this `DIR` (shared by every process of the host that names it)")
	f.Var(&c.size, "cache-size", "most bytes the --cache directory holds, e.g. 50GiB (least recently used copies go first)")
}

// check refuses a cache of a large tier that is local already, and a
// size without a cache.
func (c *cacheFlags) check(largeURL string) error {
	if c.dir == "" {
		if c.size != defaultCacheSize {
			return errors.New("--cache-size bounds the --cache directory: give --cache DIR too")
		}
		return nil
	}
	scheme, _, _ := strings.Cut(largeURL, ":")
	if scheme != "s3" && scheme != "pglo" {
		return fmt.Errorf("--cache keeps local copies of a remote large tier (--large s3://… or pglo); the large tier here is %s, which is not remote", redactedScheme(largeURL))
	}
	if !filepath.IsAbs(c.dir) {
		abs, err := filepath.Abs(c.dir)
		if err != nil {
			return fmt.Errorf("--cache %s: %v", c.dir, err)
		}
		c.dir = abs
	}
	return nil
}

// redactedScheme names a large-tier URL by its kind, never its secrets.
func redactedScheme(url string) string {
	scheme, rest, _ := strings.Cut(url, ":")
	switch scheme {
	case "local":
		return "local:" + rest
	case "none":
		return "none"
	}
	return scheme + ":"
}
