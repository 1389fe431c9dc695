package meta

import (
	"strings"

	"github.com/alkblobfs/alkblobfs/engines"
)

// The namespaces' statements, per dialect (see Links).

type nsQueries struct {
	create, remove, exists, names   string
	perm, setPerm                   string
	linkIf, has, count, entries     string
	pend, settleTake, settleLink    string
	renew, recoverTake, recoverLink string
	isLive, live                    string
	// usage (ns_usage.go)
	lockNS, held, pendHeld, charge       string
	takeRef, intentNS, takeIntent, usage string
	unique, recount, setQuota, setUsage  string
	linkRows                             string // linkBatch rows per INSERT
	anyPending                           string
	// sizes (FillSizes)
	unsized, refsSetSize, pendingSetSize string
}

// linkBatch is how many rows one LinkMany INSERT carries: 1024 bind
// parameters, far under SQLite's 32 766 and PostgreSQL's 65 535, and
// enough to amortize per-statement cost.
const linkBatch = 256

func newNSQueries(dialect string) nsQueries {
	now := "?"
	if dialect == "postgres" {
		now = "(SELECT " + engines.PGNow + ")"
	}
	r := func(q string) string { return rebindNS(dialect, strings.ReplaceAll(q, "{now}", now)) }
	q := nsQueries{
		create:  r(`INSERT INTO ns (name, created_at, uid, gid, mode) VALUES (?, ?, ?, ?, ?) ON CONFLICT (name) DO NOTHING`),
		perm:    r(`SELECT uid, gid, mode FROM ns WHERE name = ?`),
		setPerm: r(`UPDATE ns SET uid = ?, gid = ?, mode = ? WHERE name = ?`),
		remove: r(`DELETE FROM ns WHERE name = ? AND NOT EXISTS (SELECT 1 FROM ns_refs WHERE ns = ?)
			AND NOT EXISTS (SELECT 1 FROM ns_pending WHERE ns = ?)`),
		exists: r(`SELECT 1 FROM ns WHERE name = ?`),
		names:  r(`SELECT name FROM ns WHERE name > ? ORDER BY name LIMIT ?`),

		linkIf:  r(`INSERT INTO ns_refs (ns, digest, linked_at, size) SELECT ?, ?, ?, ? WHERE EXISTS (SELECT 1 FROM ns WHERE name = ?) ON CONFLICT (ns, digest) DO NOTHING`),
		has:     r(`SELECT linked_at FROM ns_refs WHERE ns = ? AND digest = ?`),
		count:   r(`SELECT COUNT(*) FROM ns_refs WHERE ns = ?`),
		entries: r(`SELECT digest, linked_at FROM ns_refs WHERE ns = ? AND digest > ? ORDER BY digest LIMIT ?`),

		pend:  r(`INSERT INTO ns_pending (id, ns, digest, holder, expiry, size) SELECT ?, ?, ?, ?, {now} + ?, ? WHERE EXISTS (SELECT 1 FROM ns WHERE name = ?)`),
		renew: r(`UPDATE ns_pending SET expiry = {now} + ? WHERE holder = ?`),
		// Settle and Recover on SQLite: take the rows, then link them, in
		// one IMMEDIATE transaction.
		settleTake:  r(`DELETE FROM ns_pending WHERE id = ? RETURNING ns, digest, size`),
		settleLink:  r(`INSERT INTO ns_refs (ns, digest, linked_at, size) VALUES (?, ?, ?, ?) ON CONFLICT (ns, digest) DO NOTHING`),
		recoverLink: r(`INSERT INTO ns_refs (ns, digest, linked_at, size) SELECT ns, digest, ?, max(size) FROM ns_pending WHERE holder = ? OR expiry < {now} GROUP BY ns, digest ON CONFLICT (ns, digest) DO NOTHING`),
		recoverTake: r(`DELETE FROM ns_pending WHERE holder = ? OR expiry < {now}`),

		// A digest is live while a namespace references it or an intent
		// means to.
		isLive: r(`SELECT 1 FROM ns_refs WHERE digest = ? UNION ALL SELECT 1 FROM ns_pending WHERE digest = ? LIMIT 1`),
		live:   r(`SELECT digest FROM ns_refs WHERE digest > ? UNION SELECT digest FROM ns_pending WHERE digest > ? ORDER BY 1 LIMIT ?`),

		unsized: r(`SELECT digest FROM ns_refs WHERE size IS NULL AND digest > ?
			UNION SELECT digest FROM ns_pending WHERE size IS NULL AND digest > ? ORDER BY 1 LIMIT ?`),
		refsSetSize:    r(`UPDATE ns_refs SET size = ? WHERE digest = ? AND size IS NULL`),
		pendingSetSize: r(`UPDATE ns_pending SET size = ? WHERE digest = ? AND size IS NULL`),
	}
	if dialect == "postgres" {
		// PostgreSQL sorts a whole UNION before its LIMIT: limit each
		// index range first (DISTINCT per branch, or one digest linked
		// in many namespaces would fill the page).
		q.live = `(SELECT DISTINCT digest FROM ns_refs WHERE digest > $1 ORDER BY digest LIMIT $3)
			UNION (SELECT DISTINCT digest FROM ns_pending WHERE digest > $2 ORDER BY digest LIMIT $3)
			ORDER BY 1 LIMIT $3`
		// One statement each: READ COMMITTED gives no snapshot across two.
		// Each first locks the namespaces' rows it settles into (k), as
		// every writer that changes what a namespace holds does
		// (ns_usage.go): an Unlink of the digest an intent settles into
		// must not judge it unheld by the intent this statement takes.
		q.settleTake = `WITH k AS (SELECT name FROM ns WHERE name = (SELECT ns FROM ns_pending WHERE id = $1) FOR NO KEY UPDATE),
			p AS (DELETE FROM ns_pending WHERE id = $1 AND ns IN (SELECT name FROM k) RETURNING ns, digest, size),
			l AS (INSERT INTO ns_refs (ns, digest, linked_at, size) SELECT ns, digest, $2::bigint, size FROM p ON CONFLICT (ns, digest) DO NOTHING RETURNING 1)
			SELECT count(*) FROM l`
		q.recoverTake = `WITH k AS (SELECT name FROM ns WHERE name IN (SELECT ns FROM ns_pending WHERE holder = $1 OR expiry < ` + now + `) ORDER BY name FOR NO KEY UPDATE),
			p AS (DELETE FROM ns_pending WHERE (holder = $1 OR expiry < ` + now + `) AND ns IN (SELECT name FROM k) RETURNING ns, digest, size),
			l AS (INSERT INTO ns_refs (ns, digest, linked_at, size) SELECT ns, digest, $2::bigint, max(size) FROM p GROUP BY ns, digest ON CONFLICT (ns, digest) DO NOTHING)
			SELECT count(*) FROM p`
	}
	q.usageQueries(dialect)
	q.linkRows = linkRowsQuery(dialect, linkBatch)
	return q
}

// refsAmongQuery is which of n digests a namespace references (HasMany).
func refsAmongQuery(dialect string, n int) string {
	return rebindNS(dialect, "SELECT digest FROM ns_refs WHERE ns = ? AND digest IN "+inList(n))
}

// pendingAmongQuery is which of n digests a namespace holds by an intent
// (chargeOfAdded: an intent already counted what a link adds).
func pendingAmongQuery(dialect string, n int) string {
	return rebindNS(dialect, "SELECT DISTINCT digest FROM ns_pending WHERE ns = ? AND digest IN "+inList(n))
}

func linkRowsQuery(dialect string, rows int) string {
	var b strings.Builder
	b.WriteString(`INSERT INTO ns_refs (ns, digest, linked_at, size) VALUES `)
	for i := range rows {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString("(?, ?, ?, ?)")
	}
	b.WriteString(` ON CONFLICT (ns, digest) DO NOTHING RETURNING digest, size`)
	return rebindNS(dialect, b.String())
}

// takeRefReturning ends Unlink's statement: the size it frees, and a
// column that PostgreSQL's Watch fills with its notification
// (notifying).
const takeRefReturning = ` RETURNING size, ''`

func (q *nsQueries) usageQueries(dialect string) {
	r := func(s string) string { return rebindNS(dialect, s) }
	lock := `SELECT blobs, bytes, quota_blobs, quota_bytes FROM ns WHERE name = ?`
	q.usage = r(lock)
	if dialect == "postgres" {
		lock += ` FOR NO KEY UPDATE`
	}
	q.lockNS = r(lock)
	q.held = r(`SELECT EXISTS (SELECT 1 FROM ns_refs WHERE ns = ? AND digest = ?) OR EXISTS (SELECT 1 FROM ns_pending WHERE ns = ? AND digest = ?)`)
	q.anyPending = r(`SELECT EXISTS (SELECT 1 FROM ns_pending WHERE ns = ?)`)
	q.pendHeld = r(`SELECT EXISTS (SELECT 1 FROM ns_pending WHERE ns = ? AND digest = ?)`)
	q.charge = r(`UPDATE ns SET blobs = blobs + ?, bytes = bytes + ? WHERE name = ?`)
	q.takeRef = r(`DELETE FROM ns_refs WHERE ns = ? AND digest = ?` + takeRefReturning)
	q.intentNS = r(`SELECT ns FROM ns_pending WHERE id = ?`)
	q.takeIntent = r(`DELETE FROM ns_pending WHERE id = ? RETURNING ns, digest, size`)
	// The digests a namespace holds, once each, with their size (a row
	// made before sizes were kept has none: it counts 0 bytes until
	// Service.FillSizes).
	held := `SELECT digest, max(size) AS size FROM (SELECT digest, size FROM ns_refs WHERE ns = ?
		UNION ALL SELECT digest, size FROM ns_pending WHERE ns = ?) h GROUP BY digest`
	q.recount = r(`SELECT count(*), coalesce(sum(size), 0) FROM (` + held + `) t`)
	q.unique = r(`SELECT count(*), coalesce(sum(size), 0) FROM (` + held + `) t
		WHERE NOT EXISTS (SELECT 1 FROM ns_refs o WHERE o.digest = t.digest AND o.ns <> ?)
		AND NOT EXISTS (SELECT 1 FROM ns_pending o WHERE o.digest = t.digest AND o.ns <> ?)`)
	q.setQuota = r(`UPDATE ns SET quota_blobs = ?, quota_bytes = ? WHERE name = ?`)
	q.setUsage = r(`UPDATE ns SET blobs = ?, bytes = ? WHERE name = ?`)
}

// notifying makes each statement that commits a change another host's
// cache must learn of (a namespace created, its permissions changed, it
// removed, a reference unlinked) one that also sends a notification for
// each row it changed (see NSNotifyChannel), with pg_notify in the same statement.
// origin, random per registry, lets the registry leave out its own
// changes. The statements still report the rows they changed: a SELECT's
// command tag counts the rows it returned, one per row changed.
func (q *nsQueries) notifying(origin string) {
	o := " " + origin + " ' || "
	q.create = notifying(q.create, "name", "'c"+o+"name")
	q.setPerm = notifying(q.setPerm, "name", "'p"+o+"name")
	q.remove = notifying(q.remove, "name", "'r"+o+"name")
	// Unlink's statement returns the size it frees, and a second column,
	// here the notification's.
	q.takeRef = "WITH n AS (" + strings.TrimSuffix(q.takeRef, takeRefReturning) + " RETURNING ns, digest, size) SELECT size, pg_notify('" + NSNotifyChannel + "', 'u" + o + "ns || ' ' || encode(digest, 'hex'))::text FROM n"
}

func notifying(stmt, returning, payload string) string {
	return "WITH n AS (" + stmt + " RETURNING " + returning + ") SELECT pg_notify('" + NSNotifyChannel + "', " + payload + ") FROM n"
}
