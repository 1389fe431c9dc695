package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/ops"
	"github.com/alkblobfs/alkblobfs/store"
)

func newNsQuotaCmd(a *app) *cobra.Command {
	var bytesFlag, blobsFlag string
	var clearQuota bool
	cmd := &cobra.Command{
		Use:         "quota NAME (--bytes SIZE | --blobs N | --clear)",
		Annotations: writesRemote,
		Short:       "Set or clear a namespace's quota",
		Long: `quota limits what namespace NAME may link: --bytes the logical bytes of its
blobs (128KiB, 10GiB, 1TB: the units of --threshold), --blobs their number.
0 removes that limit, --clear both; a limit not given is kept. A blob counts
in every namespace that links it, a dedup like any other link.

A link that would take NAME over a limit is refused: the close(2) of a file
in its incoming/ fails with EDQUOT ("Disk quota exceeded"), put --ns and
link exit 1 naming the namespace, its limit and what it holds, and HTTP
answers 507 with code quota. Nothing is linked then. A namespace already
over a new limit keeps its blobs and takes no more until it is under.
Unlinking frees quota at once, not at the next sweep. On a fleet the limit
holds across hosts within the bound docs/security.md states.

Only root and the store's owner set quotas: the owner of its kv database
file (or of its data directory); with --remote, root and the server's own
user, with a token of the sweep verb that is not bound to namespaces.
"alkblobfs ns usage NAME" shows the quota and what NAME holds.`,
		Example: `  alkblobfs ns quota builds --bytes 10GiB --blobs 1000000
  alkblobfs ns quota builds --blobs 0      # no blob limit; the byte limit stays
  alkblobfs ns quota builds --clear`,
		Args: argsRange(1, 1, "NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name := args[0]
			if err := checkName(cmd, name); err != nil {
				return err
			}
			set, err := quotaFlags(cmd, bytesFlag, blobsFlag, clearQuota)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			if a.remote != "" {
				c, err := a.client(cmd)
				if err != nil {
					return err
				}
				// The limits not given are kept: read them first.
				u, err := c.Usage(ctx, name)
				if err != nil {
					return fmt.Errorf("ns quota %s: %w", name, err)
				}
				q := set.apply(namespaces.Quota{Bytes: u.Quota.Bytes, Blobs: u.Quota.Blobs})
				if _, err := c.SetQuota(ctx, name, q.Bytes, q.Blobs); err != nil {
					return fmt.Errorf("ns quota %s: %w", name, err)
				}
				return nil
			}
			if err := a.mayQuota(); err != nil {
				return fmt.Errorf("ns quota %s: %w", name, err)
			}
			st, svc, err := a.openNamespaces(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			u, err := svc.Usage(ctx, name)
			if errors.Is(err, namespaces.ErrNotFound) {
				return noNamespace(name)
			}
			if err != nil {
				return err
			}
			if err := svc.SetQuota(ctx, name, set.apply(u.Quota)); err != nil {
				return err
			}
			return st.Close()
		},
	}
	f := cmd.Flags()
	f.StringVar(&bytesFlag, "bytes", "", "the most logical bytes the namespace may link (`SIZE`: 4096, 128KiB, 10GiB, 1TB; 0: no limit)")
	f.StringVar(&blobsFlag, "blobs", "", "the most blobs the namespace may link (`N`; 0: no limit)")
	f.BoolVar(&clearQuota, "clear", false, "remove both limits")
	return cmd
}

// quotaChange is what ns quota's flags ask for: each limit to set, or
// keep (nil).
type quotaChange struct{ bytes, blobs *int64 }

func (c quotaChange) apply(q namespaces.Quota) namespaces.Quota {
	if c.bytes != nil {
		q.Bytes = *c.bytes
	}
	if c.blobs != nil {
		q.Blobs = *c.blobs
	}
	return q
}

// quotaFlags checks ns quota's flags: a usage error (exit 2) before
// anything is opened.
func quotaFlags(cmd *cobra.Command, bytesFlag, blobsFlag string, clearQuota bool) (quotaChange, error) {
	var c quotaChange
	bytesSet, blobsSet := cmd.Flags().Changed("bytes"), cmd.Flags().Changed("blobs")
	switch {
	case clearQuota && (bytesSet || blobsSet):
		return c, usagef(cmd, "--clear removes both limits: give it alone, or --bytes and --blobs")
	case clearQuota:
		var zero int64
		return quotaChange{bytes: &zero, blobs: &zero}, nil
	case !bytesSet && !blobsSet:
		return c, usagef(cmd, "give --bytes SIZE, --blobs N or --clear (alkblobfs ns usage NAME shows the quota)")
	}
	if bytesSet {
		n, err := parseSize(bytesFlag)
		if err != nil {
			return c, usagef(cmd, "--bytes %v", err)
		}
		c.bytes = &n
	}
	if blobsSet {
		n, err := strconv.ParseInt(strings.TrimSpace(blobsFlag), 10, 64)
		if err != nil || n < 0 {
			return c, usagef(cmd, "--blobs %q: want a count of blobs, 0 for no limit", blobsFlag)
		}
		c.blobs = &n
	}
	return c, nil
}

// mayQuota applies namespaces.AllowedQuota to this process, before the
// store is opened: root, or the store's owner, who owns its SQLite
// database file (kv.db in the data directory, or --kv sqlite:PATH). A
// store whose kv engine is PostgreSQL belongs to whoever holds the
// database's credentials, so there the database's rule is the only one;
// a store not made yet is its maker's.
func (a *app) mayQuota() error {
	me := namespaces.Principal{UID: uint32(os.Getuid()), GIDs: []uint32{uint32(os.Getgid())}}
	owner := me.UID
	db := ""
	switch {
	case a.kvFile != "":
	case a.kv == "":
		if a.data != "" {
			db = filepath.Join(a.data, "kv.db")
		}
	case strings.HasPrefix(a.kv, "sqlite:"):
		db = strings.TrimPrefix(a.kv, "sqlite:")
	}
	if db != "" {
		var fi syscall.Stat_t
		switch err := syscall.Stat(db, &fi); {
		case err == nil:
			owner = fi.Uid
		case errors.Is(err, syscall.ENOENT):
		default:
			// A file this user cannot even look at is not this user's.
			return fmt.Errorf("%w: only root and the store's owner set quotas (%s: %v)", namespaces.ErrNotOwner, db, err)
		}
	}
	if err := namespaces.AllowedQuota(me, owner); err != nil {
		return fmt.Errorf("only root and the store's owner set quotas (the store's owner is uid %d, who owns %s): %w", owner, db, err)
	}
	return nil
}

func newNsUsageCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:         "usage [NAME...]",
		Annotations: remoteOK,
		Short:       "Show what namespaces hold and their quotas",
		Long: `usage prints a table of each namespace NAME (every namespace, in name order,
when none is given): the blobs it links, their logical bytes (a blob two
namespaces link counts in both), its unique bytes (of the blobs no other
namespace links: what sweeps would free if it went) and its quota, "-" for
no limit. The blob and byte counts are kept as links change, exact, and
read at once on namespaces of millions; the unique bytes are counted when
asked, over all of the namespace's links, which takes longer on large ones. With --remote it asks the server, which shows only
the namespaces the caller may search; NAME is then required.`,
		Example: `  alkblobfs ns usage
  alkblobfs ns usage builds releases`,
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkNames(cmd, args); err != nil {
				return err
			}
			ctx := cmd.Context()
			if a.remote != "" {
				if len(args) == 0 {
					return usagef(cmd, "ns usage --remote needs the NAMEs of the namespaces to show")
				}
				c, err := a.client(cmd)
				if err != nil {
					return err
				}
				rows := make([]usageLine, 0, len(args))
				for _, name := range args {
					u, err := c.Usage(ctx, name)
					if err != nil {
						return fmt.Errorf("ns usage %s: %w", name, err)
					}
					if u.Unique == nil {
						return fmt.Errorf("ns usage %s: the server's answer lacks the unique figures", name)
					}
					rows = append(rows, usageLine{
						Usage:  namespaces.Usage{Blobs: u.Blobs, Bytes: u.Bytes, Quota: namespaces.Quota{Bytes: u.Quota.Bytes, Blobs: u.Quota.Blobs}},
						unique: namespaces.UniqueUsage{Blobs: u.Unique.Blobs, Bytes: u.Unique.Bytes},
					})
				}
				return writeUsage(a.stdout, args, rows)
			}
			st, svc, err := a.openNamespaces(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			names := args
			if len(names) == 0 {
				for name, err := range svc.Names(ctx, "") {
					if err != nil {
						return err
					}
					names = append(names, name)
				}
			}
			var shown []string
			var rows []usageLine
			for _, name := range names {
				u, err := readUsageLine(ctx, svc, name)
				switch {
				case errors.Is(err, namespaces.ErrNotFound) && len(args) == 0:
					continue // removed since it was listed
				case errors.Is(err, namespaces.ErrNotFound):
					return noNamespace(name)
				case err != nil:
					return err
				}
				shown = append(shown, name)
				rows = append(rows, u)
			}
			if err := writeUsage(a.stdout, shown, rows); err != nil {
				return err
			}
			return st.Close()
		},
	}
}

// usageLine is a line of ns usage: the counters and quota, and the unique
// figures, which only ns usage asks for (ns ls -l does not).
type usageLine struct {
	namespaces.Usage
	unique namespaces.UniqueUsage
}

// readUsageLine reads namespace name's usage and unique figures.
func readUsageLine(ctx context.Context, svc *namespaces.Service, name string) (usageLine, error) {
	u, err := svc.Usage(ctx, name)
	if err != nil {
		return usageLine{}, err
	}
	uq, err := svc.Unique(ctx, name)
	if err != nil {
		return usageLine{}, err
	}
	return usageLine{Usage: u, unique: uq}, nil
}

// writeUsage prints ns usage's table: exact numbers, "-" for no limit.
func writeUsage(w io.Writer, names []string, rows []usageLine) error {
	bw := bufio.NewWriter(w)
	tw := tabwriter.NewWriter(bw, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tBLOBS\tBYTES\tUNIQUE_BYTES\tQUOTA_BYTES\tQUOTA_BLOBS")
	limit := func(n int64) string {
		if n == 0 {
			return "-"
		}
		return strconv.FormatInt(n, 10)
	}
	for i, u := range rows {
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%s\t%s\n", names[i], u.Blobs, u.Bytes, u.unique.Bytes, limit(u.Quota.Bytes), limit(u.Quota.Blobs))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	return bw.Flush()
}

// quotaRefused says, for put --ns and link, that namespace name's quota
// refused the link of what: the namespace, what it holds against its
// limits, and what to do. It wraps err (store.ErrQuota); other errors
// pass.
func quotaRefused(ctx context.Context, svc *namespaces.Service, name, what string, err error) error {
	if !errors.Is(err, store.ErrQuota) {
		return err
	}
	state := ""
	if u, uerr := svc.Usage(ctx, name); uerr == nil {
		state = " (it " + ops.QuotaState(u) + ")"
	}
	return &quotaError{
		msg: fmt.Sprintf("%s: namespace %s is at its quota%s: nothing linked; unlink blobs from it, or ask root or the store's owner for more (alkblobfs ns quota)", what, name, state),
		err: err,
	}
}

// quotaError is quotaRefused's: its own words, the registry's error
// beneath for errors.Is.
type quotaError struct {
	msg string
	err error
}

func (e *quotaError) Error() string { return e.msg }
func (e *quotaError) Unwrap() error { return e.err }
