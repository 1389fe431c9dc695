// Package namespaces keeps named sets of digest references — the
// directories at the mount root — and is a GC liveness source: a digest is
// live while any namespace references it.
//
// A [Registry] creates, lists and removes namespaces and links, unlinks,
// looks up, counts and lists references (namespace, digest, linked_at).
// Two implementations run one conformance suite (namespaces/nstest):
// [Mem] for stores without a SQL kv engine, and [SQL], two tables in the
// kv engine's own database (SQLite now, PostgreSQL later). [Open] picks the
// one that belongs with a kv engine.
//
// # Contract
//
//   - Names follow [ValidName] (1–255 bytes of [A-Za-z0-9._-], not starting
//     with '.'), checked first by every entry point.
//   - A failed call changes nothing: a bad name, Create of an existing
//     namespace, Remove of a non-empty or absent one, Unlink of an absent
//     reference, Link into an absent namespace.
//   - Link is idempotent and reports whether it added the reference;
//     linked_at comes from the injected [Clock] at the first link and is
//     kept by re-links.
//   - Names, Entries and Live stream in ascending byte order, a page at a
//     time by key (WHERE key > last ORDER BY key LIMIT n). Memory is one
//     page whatever the size of the namespace; between pages no lock,
//     connection or transaction is held, so the caller may write while
//     iterating. A listing is not a snapshot: references added or removed
//     ahead of the cursor show or vanish, none is reported twice.
//   - Count on SQL counts the namespace's key range: O(references), about
//     0.1 s at a million on SQLite. Callers on hot paths (stat of a
//     namespace directory) should not call it per lookup.
//
// # Errors
//
// ErrExists, ErrNotEmpty, ErrNotFound and ErrBadName are defined here once;
// an absent reference is blob.ErrMissing. Each comes wrapped in an [*Error]
// naming the operation, namespace and digest; match with errors.Is.
//
// # Links and the pool
//
// A Registry does not see the pool, so its Link accepts any digest. A
// [Service] wraps a Registry with a [Pool] (*store.Store) and refuses
// digests the pool does not hold (blob.ErrMissing). It pins the digest
// before checking, so that a concurrent sweep cannot delete it between the
// check and the link: the sweep's delete-time arbitration sees the pin, and
// after the link the registry itself reports the digest live.
// [Service.LinkRows], [Service.SettleRows] and [Service.PendRows] give a
// put its namespace part as a value (meta.NSRows), for store.WithLink:
// where the registry's rows are in the kv engine's database ([Joinable]),
// the engine commits it with the put's entry; elsewhere the store
// publishes first and [Service.CommitRows] writes it after.
//
// # Intents
//
// An [Intent] (Registry.Pend) is a link not made yet: the digest is live
// for the GC but not listed. The mount records one at each close of a file
// in incoming/ and settles the newest into a reference at the file's last
// close; superseded intents are dropped (Pending.Replaces), so no
// intermediate version is ever listed. Intents are rows (ns_pending) where
// the registry is SQL, so a crash loses none: Recover settles a dead
// holder's intents, and lapsed ones of any holder. A holder renews its
// intents with a TTL (Pending.TTL, Renew); whether one has lapsed is
// decided on the registry's clock for rows — the database server's on
// PostgreSQL, the host's boot clock on SQLite — never on a holder's or a
// recoverer's own, so hosts whose clocks disagree settle nothing early
// and leave nothing late.
//
// A [Lease] is how a surface holds intents: one per life of a writer (a
// mount of a mountpoint), with the renewal loop, the retries and the
// recovery of the writer's dead lives. A life on the same host is dead
// when the flock it held for its life is free, which no reused pid can
// fake; a holder on another host is settled only once it lapses.
// A process that holds no lease (the CLI, serve) settles lapsed intents
// too, with [Service.SettleLapsed] at open and [Service.KeepSettling]
// while it runs, so a dead writer whose mountpoint is never mounted
// again still has its closed files published.
//
// # Usage and quotas
//
// Every registry keeps each namespace's [Usage] exactly, below the
// surfaces: the distinct digests it links or pends and their logical
// bytes. A digest counts once per namespace, from its first link or
// intent (an intent counts from the close that records it) to the last
// of them to go: a settle changes nothing, Cancel and Unlink free at
// once, not at the sweep. A digest in two namespaces counts in both;
// [Registry.Unique] returns what no other namespace holds, computed when
// asked (O(the namespace's rows), unlike Usage's one row). Sizes reach the registry with the link: [Registry.LinkSized],
// [Pending.Size], and the put's content length in the [Service]'s publish
// hooks; a Service's own Link and Pend ask the pool ([Pool.Size]).
//
// A [Quota] (SetQuota; who may set one is [AllowedQuota]) limits bytes
// and blobs. A link or intent that would take the namespace over it fails
// with an error wrapping blob.ErrQuota and changes nothing — on SQL in the
// transaction of the row, so a put's publication rolls back with it; a
// dedup costs nothing and is never refused; LinkManySized is all or
// nothing. On SQL the counters change in the transaction that changes the
// rows, after the namespace's row is locked, so the limit holds exactly
// across processes and hosts and the counters are exact after a crash;
// [Registry.Recount] recomputes them from the rows (an open runs it when
// a migration added them, and [Service.FillSizes] sizes the references
// older stores made without sizes).
//
// # Access
//
// [Allowed] is who may use a namespace: its [Perm] against a [Principal]
// (uid and groups), by the rule the kernel applies to a directory, for
// every surface: the kernel applies it to what a mount with
// --allow-other shows, and an HTTP surface calls it ([Remove] carries the
// sticky bit's rule, which the kernel applies to an rm). [ChangePerm] is who
// may chmod, chown or chgrp one. Their errors wrap [ErrDenied] (EACCES)
// and [ErrNotOwner] (EPERM).
//
// # Concurrency
//
// Every method is safe for concurrent use. Mem serializes writers on one
// lock. SQL relies on the database: on SQLite, writers serialize on the
// write lock and each statement is atomic; on PostgreSQL a foreign key from
// ns_refs to ns keeps a concurrent Link and Remove from leaving a reference
// in a removed namespace, and every writer that may change what a
// namespace holds locks the namespace's row (FOR NO KEY UPDATE) before it
// looks, so writers of one namespace serialize on every host
// (meta/ns_usage.go).
package namespaces
