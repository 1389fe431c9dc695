package fusectl

import (
	"strings"
	"testing"
)

// CanAbort refuses a connection this process could not abort, naming it:
// the mount's guard is then not started, and the mount says why.
func TestCanAbortRefuses(t *testing.T) {
	const none = 1 << 40 // no such connection
	err := CanAbort(none)
	if err == nil {
		t.Fatal("CanAbort of a connection that does not exist: nil error")
	}
	if !strings.Contains(err.Error(), "1099511627776") {
		t.Fatalf("CanAbort's error does not name the connection: %v", err)
	}
}
