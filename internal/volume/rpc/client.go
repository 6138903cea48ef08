// Package rpc carries the volume plugin protocol over gRPC
// (api/proto/volumeplugin/v1): Client is Cubicle's side of an rpc-type
// plugin, NewServer/Serve let a plugin author expose any volume.Plugin.
package rpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"
	"unicode"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	pb "github.com/cubicle-dev/cubicle/api/proto/volumeplugin/v1"
	"github.com/cubicle-dev/cubicle/internal/volume"
)

// Client implements volume.Plugin by calling a plugin's gRPC services.
type Client struct {
	addr    string
	timeout time.Duration
	conn    *grpc.ClientConn
	ctrl    pb.VolumeControllerServiceClient
	node    pb.VolumePluginServiceClient
}

var _ volume.Plugin = (*Client)(nil)

// Dial prepares a client for the plugin at addr: a Unix socket path (bare or
// unix:///path) or TCP host:port. It does not connect: the connection is made
// on the first call and remade after failures, so a plugin started (or
// restarted) after Cubicle is picked up. Each call is bounded by timeout
// (volume.DefaultTimeout when timeout <= 0).
func Dial(addr string, timeout time.Duration) (*Client, error) {
	network, address, err := volume.ParseSocketPath(addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", volume.ErrConfig, err)
	}
	if timeout <= 0 {
		timeout = volume.DefaultTimeout
	}
	dialer := func(ctx context.Context, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, address)
	}
	// Short reconnect backoff: calls fail fast while the plugin is down, and
	// a plugin that comes back is noticed within a second.
	bo := backoff.DefaultConfig
	bo.BaseDelay = 100 * time.Millisecond
	bo.MaxDelay = time.Second
	conn, err := grpc.NewClient("passthrough:///"+address,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(dialer),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: bo, MinConnectTimeout: 5 * time.Second}),
	)
	if err != nil {
		return nil, fmt.Errorf("%w: rpc plugin at %s: %v", volume.ErrConfig, addr, err)
	}
	return &Client{
		addr: addr, timeout: timeout, conn: conn,
		ctrl: pb.NewVolumeControllerServiceClient(conn),
		node: pb.NewVolumePluginServiceClient(conn),
	}, nil
}

// Close releases the connection.
func (c *Client) Close() error { return c.conn.Close() }

// Create calls VolumeControllerService.Create.
func (c *Client) Create(ctx context.Context, req volume.CreateRequest) (volume.CreateResult, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	res, err := c.ctrl.Create(ctx, &pb.CreateRequest{VolumeId: req.VolumeID, Name: req.Name})
	if err != nil {
		return volume.CreateResult{}, c.wrap(ctx, "create", err)
	}
	return volume.CreateResult{Token: res.GetToken(), PrivateData: res.GetPrivateData()}, nil
}

// Destroy calls VolumeControllerService.Destroy.
func (c *Client) Destroy(ctx context.Context, req volume.DestroyRequest) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	if _, err := c.ctrl.Destroy(ctx, &pb.DestroyRequest{VolumeId: req.VolumeID}); err != nil {
		return c.wrap(ctx, "destroy", err)
	}
	return nil
}

// Attach calls VolumePluginService.Attach.
func (c *Client) Attach(ctx context.Context, req volume.AttachRequest) (volume.AttachResult, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	res, err := c.node.Attach(ctx, &pb.AttachRequest{
		SandboxId: req.SandboxID, Namespace: req.Namespace, VolumeId: req.VolumeID,
		RefCount: req.RefCount, VolumeBaseDir: req.VolumeBaseDir, PrivateData: req.PrivateData,
	})
	if err != nil {
		return volume.AttachResult{}, c.wrap(ctx, "attach", err)
	}
	return volume.AttachResult{HostPath: res.GetHostPath(), Metadata: res.GetMetadata()}, nil
}

// Detach calls VolumePluginService.Detach.
func (c *Client) Detach(ctx context.Context, req volume.DetachRequest) error {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	_, err := c.node.Detach(ctx, &pb.DetachRequest{
		SandboxId: req.SandboxID, Namespace: req.Namespace, VolumeId: req.VolumeID,
		RefCount: req.RefCount, Metadata: req.Metadata,
	})
	if err != nil {
		return c.wrap(ctx, "detach", err)
	}
	return nil
}

// wrap turns a gRPC error into the volume package's typed errors.
func (c *Client) wrap(ctx context.Context, op string, err error) error {
	st := status.Convert(err)
	switch {
	case st.Code() == codes.DeadlineExceeded:
		return fmt.Errorf("%w: rpc plugin at %s: %s did not answer within %s", volume.ErrPluginTimeout, c.addr, op, c.timeout)
	case st.Code() == codes.Canceled && errors.Is(ctx.Err(), context.Canceled):
		return fmt.Errorf("rpc plugin at %s: %s: %w", c.addr, op, ctx.Err())
	}
	return fmt.Errorf("%w: rpc plugin at %s: %s: %s: %s", volume.ErrPlugin, c.addr, op, codeName(st.Code()), st.Message())
}

// codeName spells a gRPC code the way people read it: "failed precondition".
func codeName(c codes.Code) string {
	var b strings.Builder
	for i, r := range c.String() {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte(' ')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}
