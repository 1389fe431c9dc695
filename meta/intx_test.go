package meta

import (
	"context"
	"database/sql"
	"testing"
	"time"
)

// TestInTxPanic: a panic in fn rolls the transaction back and goes on up;
// the connection and SQLite's write lock are free again at once.
func TestInTxPanic(t *testing.T) {
	db := openBatchDB(t)
	db.SetMaxOpenConns(1) // a transaction left open would hold the only one
	var recovered any
	func() {
		defer func() { recovered = recover() }()
		InTx(context.Background(), db, nil, func(tx *sql.Tx) error {
			if _, err := tx.Exec(`INSERT INTO t (k) VALUES ('lost')`); err != nil {
				t.Fatal(err)
			}
			panic("bug")
		})
	}()
	if recovered != "bug" {
		t.Fatalf("recovered %v; want the panic of fn", recovered)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	err := InTx(ctx, db, nil, func(tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO t (k) VALUES ('next')`)
		return err
	})
	if err != nil {
		t.Fatalf("a transaction after the panic: %v (the panicked one still holds the connection)", err)
	}
	if got := rows(t, db); len(got) != 1 || !got["next"] {
		t.Errorf("committed %v; want next only", got)
	}
}
