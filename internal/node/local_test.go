package node_test

import (
	"testing"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodetest/localnode"
)

func TestMain(m *testing.M) { localnode.Main(m) }

// Local passes the node conformance suite with runc.
func TestLocalConformance(t *testing.T) {
	localnode.Conformance(t, func(_ *testing.T, l *node.Local) node.Node { return l })
}
