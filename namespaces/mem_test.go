package namespaces_test

import (
	"testing"

	"github.com/alkblobfs/alkblobfs/namespaces"
	"github.com/alkblobfs/alkblobfs/namespaces/nstest"
)

func TestMem(t *testing.T) {
	nstest.Run(t, func(t *testing.T, c namespaces.Clock) namespaces.Registry { return namespaces.NewMem(c) })
}
