package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

func newNsCmd(a *app) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "ns",
		Short: "Create, remove and list namespaces",
		Long: `A namespace is a named set of references to blobs. A blob stays in the
store while at least one namespace links it; a blob that no namespace links
is collected by the next sweeps. Namespaces are kept in the kv engine's
database (--kv sqlite:PATH), beside the blobs they protect.

Link blobs with "put --ns NAME" or "link NAME DIGEST", list them with
"ls NAME", drop references with "unlink NAME DIGEST". "ns usage" shows what
each namespace holds, "ns quota" limits it.

` + nameRule + `.`,
		Example: `  alkblobfs ns create builds
  alkblobfs ns ls -l
  alkblobfs ns rm builds`,
		Args: subcommandArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			cmd.SetOut(a.stderr)
			cmd.Usage()
			return usage(cmd, errors.New("no subcommand given"))
		},
	}
	cmd.AddCommand(newNsCreateCmd(a), newNsRmCmd(a), newNsLsCmd(a), newNsUsageCmd(a), newNsQuotaCmd(a))
	return cmd
}

// subcommandArgs makes "PARENT typo" a usage error rather than a help page
// that exits 0.
func subcommandArgs(cmd *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	hint := ""
	if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
		hint = fmt.Sprintf("; did you mean %q?", s[0])
	}
	return usagef(cmd, "unknown command %q for %q%s", args[0], cmd.CommandPath(), hint)
}

// checkNames validates every NAME argument before anything is opened.
func checkNames(cmd *cobra.Command, names []string) error {
	for _, n := range names {
		if err := checkName(cmd, n); err != nil {
			return err
		}
	}
	return nil
}

func newNsCreateCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:         "create NAME [NAME...]",
		Annotations: writes,
		Short:       "Create empty namespaces",
		Long: `create adds each namespace NAME, empty. An existing NAME is an error (exit
status 1); create stops at the first failure, and the namespaces before it
were created. Every NAME is checked against the name rule before anything is
created.

` + nameRule + `.`,
		Example: `  alkblobfs ns create builds
  alkblobfs ns create release-1.2 release-1.3`,
		Args: argsRange(1, -1, "at least one NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkNames(cmd, args); err != nil {
				return err
			}
			st, svc, err := a.openNamespaces(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			for _, name := range args {
				if err := svc.Create(cmd.Context(), name); err != nil {
					return err
				}
			}
			return st.Close()
		},
	}
}

func newNsRmCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:         "rm NAME [NAME...]",
		Annotations: writes,
		Short:       "Remove empty namespaces",
		Long: `rm removes each namespace NAME. Only an empty namespace can be removed: one
that still links blobs is an error (exit status 1) and is left as it is;
unlink its blobs first. rm stops at the first failure; the namespaces before
it were removed.`,
		Example: `  alkblobfs ns rm builds
  alkblobfs ls builds | xargs -r alkblobfs unlink builds && alkblobfs ns rm builds`,
		Args: argsRange(1, -1, "at least one NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkNames(cmd, args); err != nil {
				return err
			}
			st, svc, err := a.openNamespaces(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			for _, name := range args {
				err := svc.Remove(cmd.Context(), name)
				if errors.Is(err, namespaces.ErrNotEmpty) {
					return fmt.Errorf("%w; unlink its blobs first: alkblobfs ls %s | xargs alkblobfs unlink %s", err, name, name)
				}
				if errors.Is(err, namespaces.ErrNotFound) {
					return noNamespaceToRemove(name)
				}
				if err != nil {
					return err
				}
			}
			return st.Close()
		},
	}
}

func newNsLsCmd(a *app) *cobra.Command {
	var long bool
	cmd := &cobra.Command{
		Use:   "ls [-l]",
		Short: "List namespaces",
		Long: `ls prints every namespace name, one per line, in ascending byte order. With
-l each name is followed by the number of blobs it links and their logical
bytes (the counts "ns usage" shows, with unique bytes and quotas).`,
		Example: `  alkblobfs ns ls
  alkblobfs ns ls -l`,
		Args: argsRange(0, 0, "no arguments"),
		RunE: func(cmd *cobra.Command, args []string) error {
			st, svc, err := a.openNamespaces(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			ctx := cmd.Context()
			w := bufio.NewWriter(a.stdout)
			for name, err := range svc.Names(ctx, "") {
				if err != nil {
					w.Flush()
					return err
				}
				if !long {
					fmt.Fprintln(w, name)
					continue
				}
				u, err := svc.Usage(ctx, name)
				if errors.Is(err, namespaces.ErrNotFound) {
					continue // removed since it was listed
				}
				if err != nil {
					w.Flush()
					return err
				}
				fmt.Fprintf(w, "%s %d %d\n", name, u.Blobs, u.Bytes)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			return st.Close()
		},
	}
	cmd.Flags().BoolVarP(&long, "long", "l", false, "print each name with the number of blobs it links and their bytes")
	return cmd
}

func newLinkCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:         "link NAME DIGEST [DIGEST...]",
		Annotations: writes,
		Short:       "Link stored blobs into a namespace",
		Long: `link adds a reference from namespace NAME to each blob DIGEST, so that sweeps
keep it. Every DIGEST must already be in the store: link refuses a digest the
store does not hold (exit status 1), and so does NAME's quota (ns quota) when
the links would take it over a limit. All or nothing: if one DIGEST is
refused, none is linked. Linking a blob that NAME already links is not an
error.`,
		Example: `  alkblobfs link builds 3f0a…e91c
  alkblobfs ls old | xargs alkblobfs link new`,
		Args: argsRange(2, -1, "NAME and at least one DIGEST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, ds, err := nameAndDigests(cmd, args)
			if err != nil {
				return err
			}
			st, svc, err := a.openNamespaces(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			ctx := cmd.Context()
			if err := mustExist(ctx, svc, name); err != nil {
				return err
			}
			if _, err := svc.LinkMany(ctx, name, ds); err != nil {
				var ne *namespaces.Error
				if errors.Is(err, store.ErrMissing) && errors.As(err, &ne) {
					return fmt.Errorf("link %s: %s: %w (not in the store); nothing linked", name, ne.Digest, store.ErrMissing)
				}
				return quotaRefused(ctx, svc, name, "link", err)
			}
			return st.Close()
		},
	}
}

func newUnlinkCmd(a *app) *cobra.Command {
	return &cobra.Command{
		Use:         "unlink NAME DIGEST [DIGEST...]",
		Annotations: writes,
		Short:       "Drop a namespace's references to blobs",
		Long: `unlink removes namespace NAME's reference to each blob DIGEST. The blob itself
stays until a sweep finds that nothing links it any more; then the next
sweeps delete it. A DIGEST that NAME does not link is an error (exit status
1); every reference is checked before any is dropped, so then nothing
changes.`,
		Example: `  alkblobfs unlink builds 3f0a…e91c
  alkblobfs ls builds | xargs -r alkblobfs unlink builds`,
		Args: argsRange(2, -1, "NAME and at least one DIGEST"),
		RunE: func(cmd *cobra.Command, args []string) error {
			name, ds, err := nameAndDigests(cmd, args)
			if err != nil {
				return err
			}
			st, svc, err := a.openNamespaces(cmd)
			if err != nil {
				return err
			}
			defer st.Close()
			ctx := cmd.Context()
			if err := mustExist(ctx, svc, name); err != nil {
				return err
			}
			for _, d := range ds {
				if err := mustLink(ctx, svc, name, d); err != nil {
					return err
				}
			}
			for _, d := range ds {
				err := svc.Unlink(ctx, name, d)
				if errors.Is(err, store.ErrMissing) {
					continue // a duplicate argument, or a concurrent unlink: the reference is gone either way
				}
				if err != nil {
					return err
				}
			}
			return st.Close()
		},
	}
}

// mustLink fails unless namespace name links d.
func mustLink(ctx context.Context, svc *namespaces.Service, name string, d store.Digest) error {
	_, ok, err := svc.Has(ctx, name, d)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("unlink %s: %s: not linked in this namespace: %w; nothing unlinked", name, d, store.ErrMissing)
	}
	return nil
}

// nameAndDigests parses "NAME DIGEST..." arguments; every mistake is a
// usage error found before anything is opened.
func nameAndDigests(cmd *cobra.Command, args []string) (string, []store.Digest, error) {
	if err := checkName(cmd, args[0]); err != nil {
		return "", nil, err
	}
	ds, err := parseDigests(cmd, args[1:])
	return args[0], ds, err
}
