package packaging

import (
	"testing"

	"github.com/alkblobfs/alkblobfs/cmd/alkblobfs/internal/clitest"
)

// TestMain builds the binary once for this package's tests (see clitest).
func TestMain(m *testing.M) { clitest.Main(m) }
