package main

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/store"
)

// app is what every command shares: the process's streams and the global
// flags. Commands write only through these streams, so they behave the same
// under test.
type app struct {
	stdin      io.Reader
	stdout     io.Writer
	stderr     io.Writer
	stderrTerm bool // progress bars are drawn only on a terminal

	data      string
	kv, large string
	kvFile    string
	scratch   string
	threshold sizeValue
	uploadMem sizeValue
	gcWindow  time.Duration
	pinTTL    time.Duration
	fleet     bool
	shared    bool
	tables    []string
	logLevel  levelValue
	remote    string     // --remote: put, get, cat, have, ns usage and ns quota go to this server
	tokenFile string     // --auth-token-file: the bearer token, server and client
	cache     cacheFlags // --cache, --cache-size (config.go)

	// inData: storeConfig put a tier in the data directory (a mount then
	// shows it as its source).
	inData bool
	// memEngine: storeConfig chose a mem: engine (noteMem says so).
	memEngine bool

	log *slog.Logger
}

func newRoot(a *app) *cobra.Command {
	a.threshold = sizeValue(store.DefaultThreshold)
	a.uploadMem = sizeValue(store.DefaultUploadMemory)
	a.logLevel = levelValue(slog.LevelWarn)
	root := &cobra.Command{
		Use:   "alkblobfs",
		Short: "A content-addressed blob store with garbage collection",
		Long: `alkblobfs stores blobs under the sha256 of their content and collects
unreferenced ones in sweeps. With no flags it uses the embedded default store:
SQLite for small blobs and a local directory for large ones, under --data.`,
		Example: `  alkblobfs ns create builds && alkblobfs put --ns builds app.tar
  alkblobfs --kv mem: --large none put notes.txt
  alkblobfs --data /srv/blobs ls`,
		// "alkblobfs typo" is a usage error.
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return nil
			}
			hint := ""
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				hint = fmt.Sprintf("; did you mean %q?", closest(args[0], s))
			}
			return usagef(cmd, "unknown command %q%s", args[0], hint)
		},
		// Bare "alkblobfs" prints a short usage, not the whole help.
		RunE: func(cmd *cobra.Command, args []string) error {
			var names []string
			for _, c := range cmd.Commands() {
				if c.IsAvailableCommand() && c.Name() != "help" {
					names = append(names, c.Name())
				}
			}
			_, err := fmt.Fprintf(a.stdout, `alkblobfs: a content-addressed blob store with garbage collection, mountable with FUSE

Usage: alkblobfs [flags] COMMAND [args]
Commands: %s

'alkblobfs COMMAND --help' explains one command, 'alkblobfs --help' everything.
`, strings.Join(names, ", "))
			return err
		},
		PersistentPreRunE: func(cmd *cobra.Command, args []string) error {
			if err := flagsFromEnv(cmd); err != nil {
				return usage(cmd, err)
			}
			if err := a.commandLogLevel(cmd); err != nil {
				return err
			}
			a.log = slog.New(slog.NewTextHandler(a.stderr, &slog.HandlerOptions{Level: slog.Level(a.logLevel)}))
			if a.remote != "" && cmd.Annotations[annRemote] == "" {
				return usagef(cmd, "%s works on a store, not through --remote (put, get, cat, have, ns usage and ns quota do)", cmd.CommandPath())
			}
			return nil
		},
		SuggestionsMinimumDistance: 2,
		SilenceErrors:              true, // main prints the one error line
		SilenceUsage:               true,
		Version:                    versionString(),
	}
	root.SetIn(a.stdin)
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error { return usage(cmd, err) })
	// Each command's help shows its own --log-level default.
	help := root.HelpFunc()
	root.SetHelpFunc(func(cmd *cobra.Command, args []string) {
		defer withLogDefault(cmd)()
		help(cmd, args)
	})

	f := root.PersistentFlags()
	f.StringVar(&a.data, "data", defaultDataDir(), "data directory of the default engines")
	f.StringVar(&a.kv, "kv", "", "kv-tier engine URL: sqlite:PATH, postgres://…, mem: or none (default sqlite:<data>/kv.db)")
	f.StringVar(&a.scratch, "scratch", "", "directory for uploads that the large tier cannot stage itself (default <data>/scratch)")
	f.StringVar(&a.kvFile, "kv-file", "", "read the --kv URL from this file (first line), so that no password shows in a process list")
	f.StringVar(&a.large, "large", "", "large-tier engine URL: local:DIR, pglo, pglo:postgres://…, mem: or none (default local:<data>/large)")
	f.Var(&a.threshold, "threshold", "largest blob the kv tier holds, e.g. 128KiB, 1MiB or plain bytes")
	f.Var(&a.uploadMem, "upload-memory", "most memory all files being written into incoming/ keep together before they spill to disk")
	f.DurationVar(&a.gcWindow, "gc-window", 0, "delay between a sweep staging a dead blob and deleting it")
	f.DurationVar(&a.pinTTL, "pin-ttl", gc.DefaultPinTTL, "life of a pin row that its process stops renewing (renewed every third of it)")
	f.BoolVar(&a.fleet, "fleet", false, "declare that several hosts share this PostgreSQL pool (checked: see 'Fleet mode' in docs/cli.md)")
	f.StringArrayVar(&a.tables, "liveness-table", nil, "a table in the kv engine's database whose digest column keeps blobs alive (repeatable; TABLE or SCHEMA.TABLE)")
	f.BoolVar(&a.shared, "shared-media", false, "with --fleet: the local large tier is on storage every host mounts at the same path")
	f.Var(&a.logLevel, "log-level", "log level on stderr (and mount's --log-file): debug, info, warn or error")
	f.StringVar(&a.remote, "remote", "", "send put, get, cat, have, ns usage and ns quota to the alkblobfs HTTP server at this `URL` (unix:PATH, or http://HOST:PORT) instead of opening a store")
	a.cache.register(f)
	f.StringVar(&a.tokenFile, "auth-token-file", "", "token file (mode 0600): serve and mount --listen HOST:PORT accept its tokens, one a line (TOKEN USER [namespaces=NS,...] [verbs=...]), rereading it within a second of a change and at once on SIGHUP; --remote sends the first token of `FILE`")

	root.AddCommand(
		newPutCmd(a),
		newGetCmd(a),
		newCatCmd(a),
		newStatCmd(a),
		newLsCmd(a),
		newRmCmd(a),
		newNsCmd(a),
		newLinkCmd(a),
		newUnlinkCmd(a),
		newSweepCmd(a),
		newVerifyCmd(a),
		newMountCmd(a),
		newUmountCmd(a),
		newUpgradeCmd(a),
		newServeCmd(a),
		newHaveCmd(a),
		newVersionCmd(a),
		newCacheCmd(a),
	)
	root.AddCommand(newManCmd(root))
	root.SetVersionTemplate("{{.Version}}\n")
	// Shell completion (cobra's): bash, zsh, fish, powershell.
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		if c.Name() == "completion" {
			c.Example = `  alkblobfs completion bash > /etc/bash_completion.d/alkblobfs
  alkblobfs completion zsh > "${fpath[1]}/_alkblobfs"`
			where := map[string]string{
				"bash":       "> /etc/bash_completion.d/alkblobfs",
				"zsh":        `> "${fpath[1]}/_alkblobfs"`,
				"fish":       "> ~/.config/fish/completions/alkblobfs.fish",
				"powershell": "| Out-String | Invoke-Expression",
			}
			for _, sh := range c.Commands() {
				sh.Example = "  alkblobfs completion " + sh.Name() + " " + where[sh.Name()]
			}
		}
	}
	return root
}

// sizeValue is a byte count flag that accepts IEC units.
type sizeValue int64

func (s *sizeValue) String() string { return formatSize(int64(*s)) }
func (s *sizeValue) Type() string   { return "size" }
func (s *sizeValue) Set(v string) error {
	n, err := parseSize(v)
	if err != nil {
		return err
	}
	if n <= 0 {
		return fmt.Errorf("%q: must be at least 1 byte", v)
	}
	*s = sizeValue(n)
	return nil
}

// annLogLevel gives a command its own --log-level default (mount and
// serve log at info, as daemons do; every other command at warn).
const annLogLevel = "alkblobfs.log-level"

// logDefault is the level that the command logs at without --log-level
// or ALKBLOBFS_LOG_LEVEL.
var logDefault = map[string]string{annLogLevel: "info"}

// commandLogLevel sets the command's own default level unless the user
// chose one.
func (a *app) commandLogLevel(cmd *cobra.Command) error {
	def := cmd.Annotations[annLogLevel]
	if def == "" {
		return nil
	}
	if f := cmd.Flag("log-level"); f == nil || f.Changed {
		return nil
	}
	if _, ok := os.LookupEnv(envName("log-level")); ok {
		return nil
	}
	return a.logLevel.Set(def)
}

// withLogDefault makes --log-level show cmd's own default in its help and
// man page, until the returned function restores it.
func withLogDefault(cmd *cobra.Command) func() {
	f := cmd.Flag("log-level")
	def := cmd.Annotations[annLogLevel]
	if f == nil || def == "" {
		return func() {}
	}
	old := f.DefValue
	f.DefValue = def
	return func() { f.DefValue = old }
}

// levelValue is a slog level flag.
type levelValue slog.Level

func (l *levelValue) String() string { return strings.ToLower(slog.Level(*l).String()) }
func (l *levelValue) Type() string   { return "level" }
func (l *levelValue) Set(v string) error {
	var lv slog.Level
	if err := lv.UnmarshalText([]byte(v)); err != nil {
		return fmt.Errorf("%q: want debug, info, warn or error", v)
	}
	*l = levelValue(lv)
	return nil
}

var (
	_ pflag.Value = (*sizeValue)(nil)
	_ pflag.Value = (*levelValue)(nil)
)

// closest is the candidate nearest to typed in edit distance (the first of
// equals): cobra lists its suggestions in command order, not by nearness.
func closest(typed string, candidates []string) string {
	best, bestD := candidates[0], -1
	for _, c := range candidates {
		if d := editDistance(typed, c); bestD < 0 || d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// envName is the environment variable of global flag name: --gc-window is
// ALKBLOBFS_GC_WINDOW.
func envName(name string) string {
	return "ALKBLOBFS_" + strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
}

// flagsFromEnv sets every global flag not given on the command line from
// its ALKBLOBFS_* variable, if set (a systemd EnvironmentFile, say): the
// flag wins over the variable. A bad value names the variable.
func flagsFromEnv(cmd *cobra.Command) error {
	var errs []error
	cmd.Root().PersistentFlags().VisitAll(func(f *pflag.Flag) {
		if f.Changed {
			return
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %v", envName(f.Name), v, err))
			}
		}
	})
	return errors.Join(errs...)
}
