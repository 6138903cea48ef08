// Package nodegrpctest serves a node.Node over an in-memory gRPC
// connection (bufconn), for tests and benchmarks that need the wire
// without a network.
package nodegrpctest

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodegrpc"
)

// Pipe serves n with nodegrpc.NewServer on a bufconn and returns the
// client for it: the control plane's view of a remote node, minus the
// network. Server and connection go when tb ends.
func Pipe(tb testing.TB, n node.Node) *nodegrpc.Client {
	tb.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := nodegrpc.NewServer(n)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(lis) }()
	cc, err := grpc.NewClient("passthrough:///node",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		srv.Stop()
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		cc.Close()
		srv.Stop()
		if err := <-served; err != nil {
			tb.Errorf("serve: %v", err)
		}
	})
	return nodegrpc.NewClient(cc)
}
