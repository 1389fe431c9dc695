package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// newCacheCmd is `alkblobfs cache stat|warm|drop`: the --cache directory
// of a remote large tier (engines/cache, through the store).
func newCacheCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cache",
		Short: "Show, warm or empty the local cache of a remote large tier (--cache)",
		Long: `cache works on the --cache directory that keeps local copies of the blobs
of an s3:// or pglo large tier. Every process of the host that names the
same --cache (mounts, serve, the CLI) shares it and its --cache-size.`,
		Example: `  alkblobfs --large s3://b/p?endpoint=h:9000 --cache /var/cache/alkblobfs cache stat
  alkblobfs … --cache /var/cache/alkblobfs cache warm builds
  alkblobfs … --cache /var/cache/alkblobfs cache drop`,
	}
	cmd.AddCommand(newCacheStatCmd(a), newCacheWarmCmd(a), newCacheDropCmd(a))
	return cmd
}

func newCacheStatCmd(a *app) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "stat",
		Short: "Print the cache's size, blob count, hit rate, fills and evictions",
		Long: `stat prints what the cache holds now and its counters summed over every
process of the host that used it (hits, misses, fills, bytes filled,
evictions, fills given up by cause, corrupt copies dropped).`,
		Args: argsRange(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := a.openCache(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			s, err := st.CacheStats(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				b, err := json.MarshalIndent(s, "", "  ")
				if err != nil {
					return err
				}
				fmt.Fprintln(a.stdout, string(b))
				return st.Close()
			}
			h := s.Host
			rate := "-"
			if n := h.Hits + h.Misses; n > 0 {
				rate = fmt.Sprintf("%.1f%%", 100*float64(h.Hits)/float64(n))
			}
			fmt.Fprintf(a.stdout, "dir         %s\n", s.Dir)
			fmt.Fprintf(a.stdout, "size        %s of %s\n", humanSize(s.Bytes), humanSize(s.Limit))
			fmt.Fprintf(a.stdout, "blobs       %d\n", s.Blobs)
			fmt.Fprintf(a.stdout, "hit rate    %s (%d hits, %d misses)\n", rate, h.Hits, h.Misses)
			fmt.Fprintf(a.stdout, "fills       %d (%s)\n", h.Fills, humanSize(h.BytesFilled))
			fmt.Fprintf(a.stdout, "evictions   %d\n", h.Evictions)
			if len(h.FillErrors) > 0 {
				var parts []string
				for k, v := range h.FillErrors {
					parts = append(parts, fmt.Sprintf("%s %d", k, v))
				}
				sort.Strings(parts)
				fmt.Fprintf(a.stdout, "fill errors %s\n", strings.Join(parts, ", "))
			}
			if h.Dropped > 0 {
				fmt.Fprintf(a.stdout, "corrupt     %d copies dropped\n", h.Dropped)
			}
			return st.Close()
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the statistics as JSON")
	return cmd
}

func newCacheWarmCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "warm NAMESPACE|DIGEST...",
		Short: "Fetch blobs into the cache in advance: a namespace's, or the digests given",
		Long: `warm fetches into the cache every large blob a namespace links, or the blobs
named by digest, with a progress bar on a terminal. A blob already cached is
read once from the cache and checked against its digest, not fetched again;
a damaged copy is replaced from the remote tier. Small blobs live in the kv
tier and need no cache.`,
		Args: argsRange(1, -1, "a namespace or digests"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			st, svc, err := a.openCacheNS(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			var ds []store.Digest
			if d, perr := store.ParseDigest(args[0]); perr == nil {
				ds = append(ds, d)
				for _, s := range args[1:] {
					d, err := store.ParseDigest(s)
					if err != nil {
						return usagef(cmd, "%q: not a digest", s)
					}
					ds = append(ds, d)
				}
			} else {
				if len(args) > 1 || svc == nil {
					return usagef(cmd, "%q: not a digest; give one namespace, or digests", args[0])
				}
				for ref, err := range svc.Entries(ctx, args[0], store.Digest{}) {
					if errors.Is(err, namespaces.ErrNotFound) {
						return noNamespace(args[0])
					}
					if err != nil {
						return err
					}
					ds = append(ds, ref.Digest)
				}
			}
			infos, err := st.StatMany(ctx, ds)
			if err != nil {
				return err
			}
			var total int64
			for _, d := range ds {
				if in, ok := infos[d]; ok && in.Tier == store.TierLarge {
					total += in.Size
				}
			}
			tr := newTransfer(ctx, a.stderr, a.stderrTerm, total, "warming")
			warmed := 0
			for _, d := range ds {
				in, ok := infos[d]
				if !ok {
					tr.done(errors.New("missing"))
					return fmt.Errorf("warm %s: %w", d, store.ErrMissing)
				}
				if in.Tier != store.TierLarge {
					continue
				}
				var last int64
				_, err := st.CacheWarm(ctx, d, func(n int64) { tr.add(int(n - last)); last = n })
				if err != nil {
					tr.done(err)
					return fmt.Errorf("warm %s: %w", d, err)
				}
				warmed++
			}
			tr.done(nil)
			fmt.Fprintf(a.stdout, "%d blobs in the cache (%s)\n", warmed, humanSize(total))
			return st.Close()
		},
	}
	return cmd
}

func newCacheDropCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:   "drop",
		Short: "Empty the cache, except the copies open or being filled on this host",
		Args:  argsRange(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, err := a.openCache(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			n, bytes, err := st.CacheDrop(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(a.stdout, "dropped %d blobs (%s)\n", n, humanSize(bytes))
			return st.Close()
		},
	}
}

// openCache opens the store and requires a cache.
func (a *app) openCache(cmd *cobra.Command) (*store.Store, error) {
	st, _, err := a.openCacheNS(cmd)
	return st, err
}

func (a *app) openCacheNS(cmd *cobra.Command) (*store.Store, *namespaces.Service, error) {
	if a.cache.dir == "" {
		return nil, nil, usagef(cmd, "%s works on the cache of a remote large tier: give --cache DIR (and --large s3://… or pglo)", cmd.CommandPath())
	}
	st, svc, err := a.openNS(cmd)
	if err != nil {
		return nil, nil, err
	}
	if !st.HasCache() {
		st.Close()
		return nil, nil, usage(cmd, store.ErrNoCache)
	}
	return st, svc, nil
}
