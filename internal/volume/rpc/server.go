package rpc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"time"

	"google.golang.org/grpc"

	pb "github.com/cubicle-dev/cubicle/api/proto/volumeplugin/v1"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/volume"
)

// server adapts a volume.Plugin to both generated service interfaces.
type server struct {
	pb.UnimplementedVolumeControllerServiceServer
	pb.UnimplementedVolumePluginServiceServer
	p volume.Plugin
}

// NewServer returns a gRPC server exposing p as VolumeControllerService and
// VolumePluginService. A hook error becomes a status with its errdefs
// class's code (Internal when unclassified; DeadlineExceeded/Canceled for
// context errors), its text as message and its reason as an ErrorInfo; an
// error that already is a gRPC status is passed through.
func NewServer(p volume.Plugin) *grpc.Server {
	s := grpc.NewServer()
	impl := &server{p: p}
	pb.RegisterVolumeControllerServiceServer(s, impl)
	pb.RegisterVolumePluginServiceServer(s, impl)
	return s
}

// toStatus is errdefs.ToGRPC: the plugin's error class picks the code.
func toStatus(err error) error { return errdefs.ToGRPC(err) }

func (s *server) Create(ctx context.Context, req *pb.CreateRequest) (*pb.CreateResponse, error) {
	res, err := s.p.Create(ctx, volume.CreateRequest{VolumeID: req.GetVolumeId(), Name: req.GetName()})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.CreateResponse{Token: res.Token, PrivateData: res.PrivateData}, nil
}

func (s *server) Destroy(ctx context.Context, req *pb.DestroyRequest) (*pb.DestroyResponse, error) {
	if err := s.p.Destroy(ctx, volume.DestroyRequest{VolumeID: req.GetVolumeId()}); err != nil {
		return nil, toStatus(err)
	}
	return &pb.DestroyResponse{}, nil
}

func (s *server) Attach(ctx context.Context, req *pb.AttachRequest) (*pb.AttachResponse, error) {
	res, err := s.p.Attach(ctx, volume.AttachRequest{
		SandboxID: req.GetSandboxId(), Namespace: req.GetNamespace(), VolumeID: req.GetVolumeId(),
		RefCount: req.GetRefCount(), VolumeBaseDir: req.GetVolumeBaseDir(), PrivateData: req.GetPrivateData(),
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.AttachResponse{HostPath: res.HostPath, Metadata: res.Metadata}, nil
}

func (s *server) Detach(ctx context.Context, req *pb.DetachRequest) (*pb.DetachResponse, error) {
	md := req.GetMetadata()
	if md == nil {
		md = map[string]string{}
	}
	err := s.p.Detach(ctx, volume.DetachRequest{
		SandboxID: req.GetSandboxId(), Namespace: req.GetNamespace(), VolumeID: req.GetVolumeId(),
		RefCount: req.GetRefCount(), Metadata: md,
	})
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.DetachResponse{}, nil
}

// gracePeriod bounds how long Serve waits for in-flight hooks at shutdown.
const gracePeriod = 10 * time.Second

// Serve exposes p at addr (a Unix socket path, unix:///path, or TCP
// host:port) until ctx ends, then stops gracefully. A stale Unix socket file
// left by a previous run is replaced; one with a live server behind it is an
// error. The socket is made mode 0660: root and the socket's group only.
func Serve(ctx context.Context, addr string, p volume.Plugin) error {
	network, address, err := volume.ParseSocketPath(addr)
	if err != nil {
		return err
	}
	if network == "unix" {
		if err := removeStaleSocket(address); err != nil {
			return err
		}
	}
	ln, err := net.Listen(network, address)
	if err != nil {
		return fmt.Errorf("volume plugin: listen on %s: %w", addr, err)
	}
	if network == "unix" {
		if err := os.Chmod(address, 0o660); err != nil {
			ln.Close()
			return fmt.Errorf("volume plugin: %w", err)
		}
	}
	srv := NewServer(p)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("volume plugin: serve on %s: %w", addr, err)
	case <-ctx.Done():
	}
	stopped := make(chan struct{})
	go func() { srv.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(gracePeriod):
		srv.Stop()
	}
	<-errc
	return nil
}

func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("volume plugin: %w", err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("volume plugin: %s exists and is not a socket", path)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("volume plugin: %s: another server is listening there", path)
	}
	if err := os.Remove(path); err != nil {
		return fmt.Errorf("volume plugin: remove stale socket: %w", err)
	}
	return nil
}
