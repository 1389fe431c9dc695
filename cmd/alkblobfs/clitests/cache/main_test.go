package cache

import (
	"testing"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// TestMain builds the binary once for this package's tests (clitest.Main).
//
// Tests run in parallel; one stays serial, saying why, when it changes
// this process (GOGC), bounds a time, or holds files open on a mount whose
// every close counts: another test's fork and exec closes copies of them,
// and each close of a file in incoming/ is a FLUSH that commits. That holds
// within this test binary; other packages' tests run in processes of
// their own (see clitest's package doc).
func TestMain(m *testing.M) { clitest.Main(m) }
