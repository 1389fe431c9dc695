package meta

import "context"

// NSQueries are the namespaces' statements by name, every one that
// reads or writes ns_refs or ns_pending (batches of two digests where the
// size varies), for the tests of their plans and placeholders.
func NSQueries(dialect string) map[string]string {
	q := newNSQueries(dialect)
	return map[string]string{
		"isLive": q.isLive, "live": q.live, "entries": q.entries, "names": q.names, "count": q.count,
		"liveAmong2": liveAmongQuery(dialect, 2),
		"held":       q.held, "pendHeld": q.pendHeld, "lockNS": q.lockNS, "takeRef": q.takeRef,
		"linkRows": q.linkRows, "usage": q.usage,
		"remove": q.remove, "linkIf": q.linkIf, "has": q.has,
		"pend": q.pend, "renew": q.renew, "settleTake": q.settleTake, "settleLink": q.settleLink,
		"recoverLink": q.recoverLink, "recoverTake": q.recoverTake,
		"anyPending": q.anyPending, "intentNS": q.intentNS, "takeIntent": q.takeIntent,
		"recount": q.recount, "unique": q.unique,
		"unsized": q.unsized, "refsSetSize": q.refsSetSize, "pendingSetSize": q.pendingSetSize,
		"refsAmong2": refsAmongQuery(dialect, 2), "pendingAmong2": pendingAmongQuery(dialect, 2),
		"holders": holdersQuery,
	}
}

// NSDDL is the namespaces' schema of dialect.
func NSDDL(dialect string) []string { return nsDDL[dialect] }

// SettleGroup runs one group of settles of ids, stamped now, in one
// statement (PostgreSQL), and returns each settle's answer.
func SettleGroup(l *Links, ids []int64, now int64) (linked []bool, errs []error) {
	var jobs []*settleJob
	for _, id := range ids {
		jobs = append(jobs, &settleJob{id: id, now: now, ctx: context.Background()})
	}
	l.settles.settle(jobs)
	for _, j := range jobs {
		linked, errs = append(linked, j.linked), append(errs, j.err)
	}
	return linked, errs
}

// RegisterHold and HoldCh are batch_test.go's alkblobfs_test_hold, for
// the external tests: one registration per test binary.
var (
	RegisterHold = registerHold
	HoldCh       = holdCh
)
