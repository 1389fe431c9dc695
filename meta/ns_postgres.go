package meta

import (
	"slices"
	"time"

	"github.com/alkblobfs/alkblobfs/blob"
)

// The PostgreSQL put batch's intents: the engine's one statement for a
// batch of puts (engines/postgres, putgroup.go) carries the intents of
// its puts' rows (Rows.NS, when NSRows.Batchable), as it carries their
// pin rows (PGBatchPins). The statement is the engine's; its part that
// writes ns_pending and ns is this package's, as are the tables.

// IntentRow is an intent a put records (NSRows.Intent), which a put
// batch's statement writes (PGBatchIntents) or NSRows.WriteTx: id in
// namespace NS for D, held by Holder, expiring TTL after the row clock's
// now, charging Size to NS's usage.
type IntentRow struct {
	ID     int64
	NS     string
	D      blob.Digest
	Holder string
	TTL    time.Duration
	Size   int64
}

// PGBatchIntents is the CTEs q, i, nw, ch, c and g of a put batch's
// statement that has intents: it follows the lock CTE l (PGLockShared)
// and the pin rows' p (PGBatchPins), and the statement's insert of the
// blobs must join g. It inserts the intents of the arrays $8-$13
// (PGIntentArgs) once every lock of l is granted (i), and keeps the
// namespaces' usage as Links does (ns_usage.go): it charges each
// namespace the digests (nw) that none of its references or intents
// named, in the statement's snapshot, and admits them against its
// quota. The statement runs after the namespaces' rows are locked in the
// same transaction (PGLockNamespaces), so its snapshot is current and no
// other writer of their holdings can commit before it does. The update
// of the row (c) still requires the version the snapshot read (its
// xmin), which the lock makes always so: a guard, should a caller ever
// run the statement without the lock (the update would otherwise apply a
// charge judged on a stale snapshot). A namespace that is absent, over
// its quota or changed since the snapshot updates no row, and then the
// division by zero (g) fails the whole statement, which commits nothing:
// the engine then runs the batch again in a transaction, where Links
// locks each namespace's row before it looks.
const PGBatchIntents = `q AS (SELECT * FROM unnest($8::bigint[], $9::text[], $10::bytea[], $11::text[], $12::bigint[], $13::bigint[]) AS u(i, n, d, h, t, s)),
	i AS (INSERT INTO ns_pending (id, ns, digest, holder, expiry, size)
		SELECT q.i, q.n, q.d, q.h, ` + nowOnce + ` + q.t, q.s FROM l, q),
	nw AS (SELECT q.n, q.d, max(q.s) AS s FROM q
		WHERE NOT EXISTS (SELECT 1 FROM ns_refs r WHERE r.ns = q.n AND r.digest = q.d)
		AND NOT EXISTS (SELECT 1 FROM ns_pending p WHERE p.ns = q.n AND p.digest = q.d)
		GROUP BY q.n, q.d),
	ch AS (SELECT ns.name, ns.xmin::text AS x, count(nw.d) AS blobs, coalesce(sum(nw.s), 0) AS bytes
		FROM ns JOIN (SELECT DISTINCT n FROM q) t ON ns.name = t.n LEFT JOIN nw ON nw.n = ns.name
		GROUP BY ns.name, ns.xmin::text),
	c AS (UPDATE ns SET blobs = ns.blobs + ch.blobs, bytes = ns.bytes + ch.bytes FROM l, ch
		WHERE ns.name = ch.name AND ns.xmin::text = ch.x
		AND (ch.blobs = 0 OR ((ns.quota_blobs = 0 OR ns.blobs + ch.blobs <= ns.quota_blobs)
			AND (ns.quota_bytes = 0 OR ns.bytes + ch.bytes <= ns.quota_bytes)))
		RETURNING 1),
	g AS MATERIALIZED (SELECT 1 / (CASE WHEN (SELECT count(*) FROM c) = (SELECT count(DISTINCT n) FROM q) THEN 1 ELSE 0 END) AS ok)`

// PGIntentArgs returns the arguments $8-$13 of PGBatchIntents for rows.
func PGIntentArgs(rows []IntentRow) []any {
	var ids, ttls, sizes []int64
	var names, holders []string
	var ds [][]byte
	for _, r := range rows {
		ids, names, ds, holders = append(ids, r.ID), append(names, r.NS), append(ds, r.D[:]), append(holders, r.Holder)
		ttls, sizes = append(ttls, int64(r.TTL)), append(sizes, r.Size)
	}
	return []any{ids, names, ds, holders, ttls, sizes}
}

// PGLockNamespaces locks the rows of the namespaces $1 (PGIntentNames)
// in name order, ahead of a one-statement batch with intents, in the
// same implicit transaction. FOR NO KEY UPDATE is the lock every writer
// of a namespace's holdings takes first (ns_usage.go); ORDER BY puts the
// locking above the sort, so the rows are locked in name order, and two
// batches that share namespaces never wait for each other in a cycle. An
// absent namespace has no row to lock: the batch's statement then fails.
const PGLockNamespaces = `SELECT name FROM ns WHERE name = ANY($1::text[]) ORDER BY name FOR NO KEY UPDATE`

// PGIntentNames returns the namespaces of rows, sorted and distinct: the
// argument of PGLockNamespaces.
func PGIntentNames(rows []IntentRow) []string {
	names := make([]string, 0, len(rows))
	for _, r := range rows {
		names = append(names, r.NS)
	}
	slices.Sort(names)
	return slices.Compact(names)
}
