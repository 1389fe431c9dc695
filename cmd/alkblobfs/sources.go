package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/alkblobfs/alkblobfs/engines"
	"github.com/alkblobfs/alkblobfs/engines/mem"
	"github.com/alkblobfs/alkblobfs/gc"
	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/store"
)

// registerSources registers every liveness source with a freshly opened
// store, for every command: sweep needs them to prove anything dead, and rm
// needs them to refuse a referenced blob (store.ErrGcRefuse).
//
// The one source today is the namespaces registry, opened in the kv
// engine's own database (namespaces.Open; cfg holds the engines the store
// was opened on) so that put --ns links in the put's transaction. It
// returns the service the commands link through, or nil when the store
// keeps no namespaces (see namespacesUnavailable): then no source is
// registered and a sweep aborts with NoLivenessSources, deleting nothing.
// The registration lives as long as st; nothing deregisters it because the
// process ends with the store.
func registerSources(ctx context.Context, st *store.Store, cfg store.Config) (*namespaces.Service, error) {
	if namespacesUnavailable(cfg) != "" {
		return nil, nil
	}
	reg, err := namespaces.Open(ctx, cfg.KV, nil)
	if err != nil {
		return nil, err
	}
	st.Register(reg)
	return namespaces.NewService(reg, st), nil
}

// registerTables registers each --liveness-table as a liveness source: an
// embedder's table in the kv engine's database whose digest column names
// live blobs (gc.Table). A name that does not parse is a usage error; a
// table that is not there fails like any open.
func (a *app) registerTables(cmd *cobra.Command, st *store.Store, cfg store.Config) error {
	if len(a.tables) == 0 {
		return nil
	}
	sq, ok := cfg.KV.(engines.SQL)
	if !ok {
		return usagef(cmd, "--liveness-table reads a table in the kv engine's database; this store's kv engine %s has none", engineName(cfg.KV))
	}
	for _, name := range a.tables {
		tbl, err := gc.NewTable(cmd.Context(), sq.DB(), sq.Dialect(), name)
		if errors.Is(err, gc.ErrTableName) {
			return usage(cmd, err)
		}
		if err != nil {
			return err
		}
		st.Register(tbl)
	}
	return nil
}

// namespacesUnavailable says why a store on the engines of cfg cannot keep
// namespaces, or "" when it can. Namespaces must last as long as the blobs
// they protect: a SQL kv engine keeps them in its database; a store that is
// all mem: dies with the process anyway, so an in-memory registry is as
// durable as its blobs. Any other store would hold durable blobs under
// references that vanish when the command exits: every sweep would then
// collect everything, so it gets no registry at all and its sweeps abort
// with NoLivenessSources.
func namespacesUnavailable(cfg store.Config) string {
	kv := cfg.KV
	if _, ok := kv.(engines.SQL); ok {
		return ""
	}
	_, kvMem := kv.(*mem.Engine)
	_, largeMem := cfg.Large.(*mem.Engine)
	switch {
	case kvMem && (cfg.Large == nil || largeMem):
		return ""
	case kv == nil:
		return "it has no kv tier (--kv none), and namespaces live in the kv engine's database; use --kv sqlite:PATH"
	default:
		return fmt.Sprintf("its kv engine %s keeps nothing after this command exits, while the large tier's blobs stay; use --kv sqlite:PATH", kv.Name())
	}
}

// openNamespaces opens the store for a namespaces command. A store that
// keeps no namespaces is a usage error: the flags chose engines that cannot
// hold them.
func (a *app) openNamespaces(cmd *cobra.Command) (*store.Store, *namespaces.Service, error) {
	st, cfg, svc, err := a.openStore(cmd)
	if err != nil {
		return nil, nil, err
	}
	if svc == nil {
		why := namespacesUnavailable(cfg)
		st.Close()
		return nil, nil, usagef(cmd, "this store keeps no namespaces: %s", why)
	}
	a.noteMem()
	return st, svc, nil
}

// nameRule is the namespace name rule, for error messages.
const nameRule = "a namespace name is 1-255 bytes of A-Z a-z 0-9 . _ -, not starting with '.'"

// checkName validates a NAME argument before anything is opened, so that a
// bad name changes nothing. The error is a usage error (exit status 2) that
// states the rule and wraps namespaces.ErrBadName.
func checkName(cmd *cobra.Command, name string) error {
	if err := namespaces.ValidName(name); err != nil {
		shown := name
		if len(shown) > 80 {
			shown = shown[:80] + "…"
		}
		return usagef(cmd, "namespace %q: %w; %s", shown, err, nameRule)
	}
	return nil
}

// mustExist fails with ErrNotFound and a hint unless namespace name exists.
func mustExist(ctx context.Context, svc *namespaces.Service, name string) error {
	ok, err := svc.Exists(ctx, name)
	if err != nil {
		return err
	}
	if !ok {
		return noNamespace(name)
	}
	return nil
}

// noNamespace says that namespace name does not exist, in the user's
// words, with the command that creates it. It is namespaces.ErrNotFound.
func noNamespace(name string) error { return &noNamespaceError{name: name} }

// noNamespaceToRemove is noNamespace for ns rm, which has nothing to do:
// no hint to create what the user meant to remove.
func noNamespaceToRemove(name string) error { return &noNamespaceError{name: name, rm: true} }

type noNamespaceError struct {
	name string
	rm   bool
}

func (e *noNamespaceError) Error() string {
	if e.rm {
		return fmt.Sprintf("namespace %q does not exist (nothing to remove)", e.name)
	}
	return fmt.Sprintf("namespace %q does not exist (create it with 'alkblobfs ns create %s')", e.name, e.name)
}

func (e *noNamespaceError) Unwrap() error { return namespaces.ErrNotFound }

// fillSizes gives the references an older version made, without their
// blobs' sizes, the sizes from the pool, so that namespace usage and
// quotas count them (namespaces.Service.FillSizes). Every process that
// writes the store does it as it opens it: on a store made since, an
// index finds nothing to do at once. A failure leaves those references
// counted as 0 bytes until the next writer.
func (a *app) fillSizes(ctx context.Context, svc *namespaces.Service) {
	if n, err := svc.FillSizes(ctx); err != nil {
		a.log.Warn("could not size the references an older version made; namespace usage counts them as 0 bytes until the next process that writes the store", "err", err)
	} else if n > 0 {
		a.log.Info("sized the references an older version made, for namespace usage and quotas", "blobs", n)
	}
}
