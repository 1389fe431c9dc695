package enginetest

import (
	"context"
	"database/sql"
	"errors"
	"testing"

	"github.com/alkblobfs/alkblobfs/blob"
	"github.com/alkblobfs/alkblobfs/engines"
)

// testTxPutter checks that PutTx's callback shares the insert's fate. The
// SQL is dialect-neutral (no placeholders) so every SQL engine runs it.
func (s *suite) testTxPutter(t *testing.T) {
	e := s.engine(t)
	tp := e.(engines.TxPutter)
	db := e.(engines.SQL).DB()
	ctx := t.Context()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS enginetest_tx (k TEXT PRIMARY KEY)`); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.ExecContext(context.Background(), `DROP TABLE enginetest_tx`) })
	insert := func(k string) func(context.Context, *sql.Tx) error {
		return func(ctx context.Context, tx *sql.Tx) error {
			_, err := tx.ExecContext(ctx, `INSERT INTO enginetest_tx (k) VALUES ('`+k+`')`)
			return err
		}
	}
	hasRow := func(k string) bool {
		t.Helper()
		var n int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM enginetest_tx WHERE k = '`+k+`'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n == 1
	}

	v1, v2 := value(100, 1), value(100, 2)
	d1, d2 := blob.Sum(v1), blob.Sum(v2)
	if ins, err := tp.PutTx(ctx, d1, v1, insert("one")); !ins || err != nil {
		t.Fatalf("PutTx = %v, %v; want true, nil", ins, err)
	}
	if !hasRow("one") {
		t.Fatal("PutTx committed the blob but not the callback's row")
	}
	checkContent(t, e, d1, v1)

	boom := errors.New("boom")
	_, err := tp.PutTx(ctx, d2, v2, func(ctx context.Context, tx *sql.Tx) error {
		if err := insert("two")(ctx, tx); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("PutTx with a failing callback: err = %v; want it to wrap the callback's error", err)
	}
	checkAbsent(t, e, d2)
	if hasRow("two") {
		t.Fatal("a failed PutTx committed the callback's row")
	}

	// A dedup still runs and commits the callback (publish-and-link of
	// present content).
	if ins, err := tp.PutTx(ctx, d1, v1, insert("three")); ins || err != nil {
		t.Fatalf("dedup PutTx = %v, %v; want false, nil", ins, err)
	}
	if !hasRow("three") {
		t.Fatal("a dedup PutTx did not commit the callback's row")
	}
	checkSQLIdle(t, e, "after PutTx")
}
