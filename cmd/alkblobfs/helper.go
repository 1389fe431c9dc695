package main

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
)

// helperName is the name under which mount(8) runs alkblobfs for a
// filesystem of type fuse.alkblobfs (an fstab line, mount -t): it looks
// for /sbin/mount.fuse.alkblobfs. make install links that name to the
// binary.
const helperName = "mount.fuse.alkblobfs"

// helperOptions maps fstab options (-o name=value) to mount and store
// flags; a flag's value comes from the option, or is the option alone
// for the boolean ones.
var helperOptions = map[string]string{
	"kv": "--kv", "kv_file": "--kv-file", "large": "--large", "threshold": "--threshold",
	"upload_memory": "--upload-memory", "scratch": "--scratch", "gc_window": "--gc-window",
	"pin_ttl": "--pin-ttl", "fleet": "--fleet", "shared_media": "--shared-media",
	"verify": "--verify", "sweep_every": "--sweep-every", "scrub_every": "--scrub-every",
	"scrub_rate": "--scrub-rate", "receipt_ttl": "--receipt-ttl", "max_receipts": "--max-receipts",
	"allow_other": "--allow-other", "ro": "--read-only", "nonempty": "--nonempty",
	"passthrough": "--passthrough", "log_file": "--log-file", "log_level": "--log-level",
	"debug": "--debug", "heap_target": "--heap-target", "restart_on_crash": "--restart-on-crash",
}

// globalOptions are the store's flags, which go before the mount command.
var globalOptions = []string{"--kv", "--kv-file", "--large", "--threshold", "--upload-memory", "--scratch",
	"--gc-window", "--pin-ttl", "--fleet", "--shared-media", "--log-level"}

// ignoredOptions are mount(8)'s own options, and generic ones a FUSE
// mount sets itself: accepted and dropped.
var ignoredOptions = []string{"rw", "defaults", "auto", "noauto", "nofail", "_netdev", "user", "users",
	"nouser", "owner", "group", "exec", "noexec", "suid", "nosuid", "dev", "nodev", "async", "sync",
	"atime", "noatime", "relatime", "norelatime", "strictatime", "lazytime", "nolazytime", "diratime",
	"nodiratime", "silent", "loud"}

// helperCall is mount(8)'s call of the helper, translated.
type helperCall struct {
	source     string   // SOURCE as mount(8) passed it
	global     []string // flags before the mount command: the store's
	local      []string // the mount command's
	mountpoint string
	fake       bool // -f: do everything but mount
}

// parseHelper turns mount(8)'s call of the helper — SOURCE MOUNTPOINT
// [-o OPTIONS] [-n] [-s] [-f] [-v] — into alkblobfs's own arguments: a
// SOURCE that is an absolute path is the data directory, the options
// become flags, and the mount runs with --daemon so that the helper
// returns only once it serves (or fails with the reason).
func parseHelper(args []string) (helperCall, error) {
	var h helperCall
	var pos, opts []string
	sloppy := false
	for i := 0; i < len(args); i++ {
		a := args[i]
		switch {
		case a == "-o":
			if i+1 >= len(args) {
				return h, fmt.Errorf("-o needs options")
			}
			i++
			opts = append(opts, strings.Split(args[i], ",")...)
		case strings.HasPrefix(a, "-o"):
			opts = append(opts, strings.Split(a[2:], ",")...)
		case a == "-t":
			i++ // the type: fuse.alkblobfs
		case strings.HasPrefix(a, "-") && len(a) > 1:
			for _, c := range a[1:] {
				switch c {
				case 'n', 'v':
				case 's':
					sloppy = true
				case 'f':
					h.fake = true
				default:
					return h, fmt.Errorf("unknown flag -%c (mount(8) passes -o, -n, -s, -f, -v)", c)
				}
			}
		default:
			pos = append(pos, a)
		}
	}
	if len(pos) != 2 {
		return h, fmt.Errorf("want SOURCE MOUNTPOINT [-o OPTIONS], got %d arguments", len(pos))
	}
	h.source, h.mountpoint = pos[0], pos[1]
	if filepath.IsAbs(h.source) {
		h.global = append(h.global, "--data", h.source)
	}
	for _, o := range opts {
		if o == "" || slices.Contains(ignoredOptions, o) || strings.HasPrefix(o, "x-") || strings.HasPrefix(o, "comment=") {
			continue
		}
		name, val, hasVal := strings.Cut(o, "=")
		flag, ok := helperOptions[name]
		if !ok {
			if sloppy {
				continue
			}
			return h, fmt.Errorf("unknown option %q (known: %s; and mount(8)'s own, which are ignored)", o, strings.Join(knownOptions(), ", "))
		}
		f := []string{flag}
		if hasVal {
			f = []string{flag + "=" + val}
		}
		if slices.Contains(globalOptions, flag) {
			h.global = append(h.global, f...)
		} else {
			h.local = append(h.local, f...)
		}
	}
	return h, nil
}

// argv is alkblobfs's arguments for the call. The mount shows SOURCE as
// its own (--source): mount(8) finds an fstab line mounted only if
// mountinfo shows the line's source on its mountpoint, and `mount -a`
// would otherwise try every line again and fail on the busy mountpoints.
func (h helperCall) argv() []string {
	out := append(slices.Clone(h.global), "mount", "--daemon", "--source="+h.source)
	out = append(out, h.local...)
	return append(out, h.mountpoint)
}

// helperArgs is the translation of the options alone: argv without
// --source.
func helperArgs(args []string) (out []string, fake bool, err error) {
	h, err := parseHelper(args)
	if err != nil {
		return nil, false, err
	}
	out = append(slices.Clone(h.global), "mount", "--daemon")
	out = append(out, h.local...)
	return append(out, h.mountpoint), h.fake, nil
}

func knownOptions() []string { return slices.Sorted(maps.Keys(helperOptions)) }

// runHelper is main for the mount helper: it execs alkblobfs with the
// translated arguments, or returns the exit status of a failure.
func runHelper(args []string) int {
	h, err := parseHelper(args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: %v\n", helperName, err)
		return 2
	}
	if h.fake {
		return 0
	}
	exe, err := os.Executable()
	if err == nil {
		// mount(8) runs helpers with a minimal environment: keep it.
		err = syscall.Exec(exe, append([]string{"alkblobfs"}, h.argv()...), os.Environ())
	}
	fmt.Fprintf(os.Stderr, "%s: %v\n", helperName, err)
	return 1
}
