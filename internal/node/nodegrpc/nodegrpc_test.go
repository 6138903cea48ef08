package nodegrpc_test

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodegrpc"
	"github.com/cubicle-dev/cubicle/internal/node/nodegrpc/nodegrpctest"
	"github.com/cubicle-dev/cubicle/internal/node/nodetest/localnode"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

func TestMain(m *testing.M) { localnode.Main(m) }

// The gRPC client over a bufconn passes the same suite as the Local behind
// it: the node on the wire is the node.
func TestGRPCConformance(t *testing.T) {
	localnode.Conformance(t, func(t *testing.T, l *node.Local) node.Node { return nodegrpctest.Pipe(t, l) })
}

// Each error class the node returns means the same after the wire: the
// same class and gRPC code, reason, message and sentinels (errors.Is), and
// the same typed error (errors.As) where there is one.
func TestErrorsSurviveTheWire(t *testing.T) {
	l, plugin := localnode.New(t)
	c := nodegrpctest.Pipe(t, l)
	layers := localnode.Layers(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// A paused sandbox, for the errors of a sandbox in the wrong state.
	id := "errs" + localnode.RandHex(t, 8)
	if _, err := l.Create(ctx, node.CreateRequest{ID: id, Layers: layers, EnvdToken: "tok", CPUCount: 1, MemoryMB: 128}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Delete(context.Background(), id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	})
	if err := l.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	vol := localnode.NewVolume(t, plugin)

	cases := []struct {
		name string
		call func(ctx context.Context, n node.Node) error
		is   []error // sentinels and classes it must match on both sides
	}{
		{"not found", func(ctx context.Context, n node.Node) error { _, err := n.Get(ctx, "nosuchsandbox0000000"); return err },
			[]error{node.ErrNotFound, runtime.ErrNotFound, errdefs.ErrNotFound}},
		{"not running", func(ctx context.Context, n node.Node) error { return n.Pause(ctx, id) },
			[]error{runtime.ErrNotRunning, errdefs.ErrFailedPrecondition}},
		// The agent of a paused sandbox never answers: the caller's
		// deadline ends the call on the node as it does in-process.
		{"deadline", func(ctx context.Context, n node.Node) error {
			ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			_, err := n.Run(ctx, id, "tok", "user", "true")
			return err
		}, []error{context.DeadlineExceeded}},
		{"accelerator not found", func(ctx context.Context, n node.Node) error {
			_, err := n.Accelerator(ctx, "gpu-0000:00:00.0")
			return err
		},
			[]error{accel.ErrNotFound, errdefs.ErrNotFound}},
		{"accelerators incompatible", func(ctx context.Context, n node.Node) error {
			_, err := n.Create(ctx, node.CreateRequest{ID: "acc" + localnode.RandHex(t, 8), Layers: layers, EnvdToken: "tok",
				CPUCount: 1, MemoryMB: 128, Accelerators: []accel.Request{{Class: accel.ClassGPU, Count: 1}}})
			return err
		}, []error{accel.ErrIncompatible, errdefs.ErrInvalidArgument}},
		{"no egress proxy", func(ctx context.Context, n node.Node) error { return n.CheckUpstream(ctx, "127.0.0.1:1080") },
			[]error{network.ErrUpstream, network.ErrInvalidPolicy, errdefs.ErrInvalidArgument}},
		{"invalid policy", func(ctx context.Context, n node.Node) error {
			return n.UpdatePolicy(ctx, id, network.Policy{AllowOut: []string{"not an address!"}})
		}, []error{network.ErrInvalidPolicy, errdefs.ErrInvalidArgument}},
		{"unknown volume driver", func(ctx context.Context, n node.Node) error {
			_, err := n.AttachVolume(ctx, "content-x", node.VolumeAttachment{VolumeID: vol.VolumeID, Driver: "nosuchdriver"})
			return err
		}, []error{node.ErrVolumeDriver, errdefs.ErrInvalidArgument}},
		// An error nobody classified is Internal, with its message.
		{"unclassified", func(ctx context.Context, n node.Node) error { _, err := n.Snapshot(ctx, id, "Not An ID"); return err },
			nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			local, remote := tc.call(cctx, l), tc.call(cctx, c)
			if local == nil || remote == nil {
				t.Fatalf("want an error on both sides; local %v, remote %v", local, remote)
			}
			if lc, rc := errdefs.Code(local), errdefs.Code(remote); lc != rc {
				t.Errorf("code: local %v, remote %v", lc, rc)
			}
			if lr, rr := errdefs.Reason(local), errdefs.Reason(remote); lr != rr {
				t.Errorf("reason: local %q, remote %q", lr, rr)
			}
			// A deadline met by the client is its own message, not the node's.
			if tc.name != "deadline" && local.Error() != remote.Error() {
				t.Errorf("message: local %q, remote %q", local, remote)
			}
			for _, s := range tc.is {
				if !errors.Is(local, s) || !errors.Is(remote, s) {
					t.Errorf("errors.Is(%v): local %v, remote %v", s, errors.Is(local, s), errors.Is(remote, s))
				}
			}
			for _, s := range []error{runtime.ErrNotRunning, runtime.ErrNotFound, node.ErrNotFound, accel.ErrIncompatible, network.ErrUpstream} {
				if errors.Is(local, s) != errors.Is(remote, s) {
					t.Errorf("errors.Is(%v): local %v, remote %v", s, errors.Is(local, s), errors.Is(remote, s))
				}
			}
			var lfe, rfe *network.FieldError
			if errors.As(local, &lfe) {
				if !errors.As(remote, &rfe) || rfe.Field != lfe.Field || rfe.Error() != lfe.Error() || !errors.Is(rfe.Kind, lfe.Kind) {
					t.Errorf("FieldError: local %#v, remote %#v", lfe, rfe)
				}
			}
			var lce, rce *accel.CompatError
			if errors.As(local, &lce) {
				if !errors.As(remote, &rce) || *rce != *lce {
					t.Errorf("CompatError: local %#v, remote %#v", lce, rce)
				}
			}
		})
	}
}

// The exit stream outlives the node's server: when the node goes away
// (its gRPC server stops, as when `cubicle node` restarts) the client opens
// the stream again on the same connection once the node is back, and the
// channel the control plane reads keeps reporting exits.
func TestExitsSurviveANodeRestart(t *testing.T) {
	l, _ := localnode.New(t)
	var cur atomic.Pointer[bufconn.Listener]
	serve := func() *grpc.Server {
		lis := bufconn.Listen(1 << 20)
		srv := nodegrpc.NewServer(l)
		done := make(chan struct{})
		go func() { defer close(done); srv.Serve(lis) }()
		t.Cleanup(func() { srv.Stop(); <-done })
		cur.Store(lis)
		return srv
	}
	first := serve()
	cc, err := grpc.NewClient("passthrough:///node",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return cur.Load().DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	c := nodegrpc.NewClient(cc)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exits, err := c.Exits(ctx)
	if err != nil || exits == nil {
		t.Fatalf("Exits: %v (channel %v)", err, exits)
	}

	first.Stop() // the node goes away...
	serve()      // ...and comes back on a new listener
	// A call racing the old transport's close may fail once; what is
	// tested is the exit stream, so wait until the node answers again.
	for i := 0; ; i++ {
		if _, err := c.Info(ctx); err == nil {
			break
		} else if i == 100 {
			t.Fatalf("the node never answered again: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	id := "exit" + localnode.RandHex(t, 8)
	sb, err := c.Create(ctx, node.CreateRequest{ID: id, Layers: localnode.Layers(t), EnvdToken: "tok", CPUCount: 1, MemoryMB: 128})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Delete(context.Background(), id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	})
	if err := syscall.Kill(sb.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case e, ok := <-exits:
		if !ok || e.ID != id || e.Pid != sb.Pid || e.At.IsZero() {
			t.Fatalf("exit %+v (open %v), want %s pid %d with a time", e, ok, id, sb.Pid)
		}
	case <-ctx.Done():
		t.Fatal("no exit reported after the node's server restarted")
	}
	// The channel ends with the caller's context.
	cancel()
	for range exits {
	}
}
