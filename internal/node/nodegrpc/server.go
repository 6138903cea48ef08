// Package nodegrpc puts node.Node on the wire: a gRPC server with one
// service per interface node.Node is composed of (api/proto/node/v1), and a
// client that implements node.Node over a connection to it. Callers see
// only node.Node (containerd's services/ and proxy/ are the model): an
// error crosses as errdefs.ToGRPC and comes back with errdefs.ToNative, so
// errors.Is and errors.As checks behave as they do in-process.
//
// Transport security is the caller's: NewServer takes grpc.ServerOptions
// (credentials, interceptors) and NewClient any connection.
package nodegrpc

import (
	"context"

	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"

	nodev1 "github.com/cubicle-dev/cubicle/api/proto/node/v1"
	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/phase"
)

// MaxMessageSize bounds one message in each direction, on both sides. The
// largest message is a Logs reply (a sandbox's console log, up to 1 MiB);
// gRPC's default receive limit is 4 MiB, and 16 MiB leaves room for an
// inventory or a reference list of a large node without being a way to
// exhaust memory.
const MaxMessageSize = 16 << 20

// watchingHeader says in the Exits stream's header whether the node
// watches exits at all (node.Events: a node that does not returns a nil
// channel).
const watchingHeader = "cubicle-exits-watching"

// ServerOptions are the options NewServer applies before the caller's.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageSize), grpc.MaxSendMsgSize(MaxMessageSize)}
}

// NewServer is a gRPC server serving n's every service. opts (transport
// credentials, interceptors...) come after ServerOptions.
func NewServer(n node.Node, opts ...grpc.ServerOption) *grpc.Server {
	s := grpc.NewServer(append(ServerOptions(), opts...)...)
	Register(s, n)
	return s
}

// Register registers n's every service on s.
func Register(s grpc.ServiceRegistrar, n node.Node) {
	nodev1.RegisterInfoServer(s, &infoServer{n: n})
	nodev1.RegisterSandboxesServer(s, &sandboxesServer{n: n})
	nodev1.RegisterAgentServer(s, &agentServer{n: n})
	nodev1.RegisterNetworkServer(s, &networkServer{n: n})
	nodev1.RegisterSnapshotsServer(s, &snapshotsServer{n: n})
	nodev1.RegisterVolumesServer(s, &volumesServer{n: n})
	nodev1.RegisterAcceleratorsServer(s, &acceleratorsServer{n: n})
	nodev1.RegisterEventsServer(s, &eventsServer{n: n})
	nodev1.RegisterImagesServer(s, &imagesServer{n: n})
}

type imagesServer struct {
	nodev1.UnimplementedImagesServer
	n node.Node
}

func (s *imagesServer) PullImage(ctx context.Context, r *nodev1.PullImageRequest) (*nodev1.Empty, error) {
	return done(s.n.PullImage(ctx, imageFromProto(r.GetImage())))
}

var empty = &nodev1.Empty{}

// done is the reply of a call that returns only an error.
func done(err error) (*nodev1.Empty, error) {
	if err != nil {
		return nil, toStatus(err)
	}
	return empty, nil
}

type infoServer struct {
	nodev1.UnimplementedInfoServer
	n node.Node
}

func (s *infoServer) Info(ctx context.Context, _ *nodev1.InfoRequest) (*nodev1.NodeInfo, error) {
	i, err := s.n.Info(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return infoToProto(i), nil
}

type sandboxesServer struct {
	nodev1.UnimplementedSandboxesServer
	n node.Node
}

func (s *sandboxesServer) Create(ctx context.Context, r *nodev1.CreateRequest) (*nodev1.Sandbox, error) {
	// The node's phases go back in the answer: the control plane's
	// trace (Server-Timing, the phase histogram) includes them.
	tr := phase.New()
	sb, err := s.n.Create(phase.With(ctx, tr), createFromProto(r))
	if err != nil {
		return nil, toStatus(err)
	}
	p := sandboxToProto(sb)
	p.Phases, p.Runtime = phasesToProto(tr.Phases()), tr.Runtime()
	return p, nil
}

func (s *sandboxesServer) Delete(ctx context.Context, r *nodev1.IDRequest) (*nodev1.Empty, error) {
	return done(s.n.Delete(ctx, r.GetId()))
}

func (s *sandboxesServer) Pause(ctx context.Context, r *nodev1.IDRequest) (*nodev1.Empty, error) {
	return done(s.n.Pause(ctx, r.GetId()))
}

func (s *sandboxesServer) Resume(ctx context.Context, r *nodev1.ResumeRequest) (*nodev1.Empty, error) {
	return done(s.n.Resume(ctx, r.GetId(), createFromProto(r.GetRequest())))
}

func (s *sandboxesServer) Stop(ctx context.Context, r *nodev1.IDRequest) (*nodev1.Empty, error) {
	return done(s.n.Stop(ctx, r.GetId()))
}

func (s *sandboxesServer) Rebuild(ctx context.Context, r *nodev1.RebuildRequest) (*nodev1.Empty, error) {
	return done(s.n.Rebuild(ctx, r.GetId(), createFromProto(r.GetRequest())))
}

func (s *sandboxesServer) Get(ctx context.Context, r *nodev1.IDRequest) (*nodev1.Sandbox, error) {
	sb, err := s.n.Get(ctx, r.GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	return sandboxToProto(sb), nil
}

func (s *sandboxesServer) List(ctx context.Context, _ *nodev1.ListRequest) (*nodev1.ListResponse, error) {
	l, err := s.n.List(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &nodev1.ListResponse{Sandboxes: make([]*nodev1.Sandbox, 0, len(l))}
	for _, sb := range l {
		out.Sandboxes = append(out.Sandboxes, sandboxToProto(sb))
	}
	return out, nil
}

func (s *sandboxesServer) Stats(ctx context.Context, r *nodev1.StatsRequest) (*nodev1.Stats, error) {
	st, err := s.n.Stats(ctx, r.GetId(), r.GetToken())
	if err != nil {
		return nil, toStatus(err)
	}
	return statsToProto(st), nil
}

func (s *sandboxesServer) Logs(ctx context.Context, r *nodev1.IDRequest) (*nodev1.LogsResponse, error) {
	b, err := s.n.Logs(ctx, r.GetId())
	if err != nil {
		return nil, toStatus(err)
	}
	return &nodev1.LogsResponse{Data: b}, nil
}

type agentServer struct {
	nodev1.UnimplementedAgentServer
	n node.Node
}

func (s *agentServer) Reinit(ctx context.Context, r *nodev1.ReinitRequest) (*nodev1.Empty, error) {
	return done(s.n.Reinit(ctx, r.GetId(), createFromProto(r.GetRequest()), r.GetCurrentToken()))
}

func (s *agentServer) Run(ctx context.Context, r *nodev1.RunRequest) (*nodev1.RunResponse, error) {
	code, err := s.n.Run(ctx, r.GetId(), r.GetToken(), r.GetUser(), r.GetCmd())
	if err != nil {
		return nil, toStatus(err)
	}
	return &nodev1.RunResponse{ExitCode: int64(code)}, nil
}

type networkServer struct {
	nodev1.UnimplementedNetworkServer
	n node.Node
}

func (s *networkServer) UpdatePolicy(ctx context.Context, r *nodev1.UpdatePolicyRequest) (*nodev1.Empty, error) {
	return done(s.n.UpdatePolicy(ctx, r.GetId(), policyFromProto(r.GetPolicy())))
}

func (s *networkServer) CheckUpstream(ctx context.Context, r *nodev1.CheckUpstreamRequest) (*nodev1.Empty, error) {
	return done(s.n.CheckUpstream(ctx, r.GetAddress()))
}

type snapshotsServer struct {
	nodev1.UnimplementedSnapshotsServer
	n node.Node
}

func (s *snapshotsServer) Snapshot(ctx context.Context, r *nodev1.SnapshotRequest) (*nodev1.Snapshot, error) {
	sn, err := s.n.Snapshot(ctx, r.GetId(), r.GetSnapshotId())
	if err != nil {
		return nil, toStatus(err)
	}
	return snapshotToProto(sn), nil
}

func (s *snapshotsServer) DeleteSnapshot(ctx context.Context, r *nodev1.DeleteSnapshotRequest) (*nodev1.Empty, error) {
	return done(s.n.DeleteSnapshot(ctx, r.GetSnapshotId()))
}

func (s *snapshotsServer) Snapshots(ctx context.Context, _ *nodev1.ListSnapshotsRequest) (*nodev1.ListSnapshotsResponse, error) {
	ids, err := s.n.Snapshots(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	return &nodev1.ListSnapshotsResponse{SnapshotIds: ids}, nil
}

func (s *snapshotsServer) PushSnapshot(ctx context.Context, r *nodev1.PushSnapshotRequest) (*nodev1.PushSnapshotResponse, error) {
	objs, err := s.n.PushSnapshot(ctx, r.GetSnapshotId(), objectsFromProto(r.GetTargets()))
	if err != nil {
		return nil, toStatus(err)
	}
	return &nodev1.PushSnapshotResponse{Objects: objectsToProto(objs)}, nil
}

func (s *snapshotsServer) FetchSnapshot(ctx context.Context, r *nodev1.FetchSnapshotRequest) (*nodev1.Empty, error) {
	return done(s.n.FetchSnapshot(ctx, r.GetSnapshotId(), objectsFromProto(r.GetSources())))
}

type volumesServer struct {
	nodev1.UnimplementedVolumesServer
	n node.Node
}

func (s *volumesServer) AttachVolume(ctx context.Context, r *nodev1.AttachVolumeRequest) (*nodev1.AttachVolumeResponse, error) {
	p, err := s.n.AttachVolume(ctx, r.GetHolder(), attachmentFromProto(r.GetAttachment()))
	if err != nil {
		return nil, toStatus(err)
	}
	return &nodev1.AttachVolumeResponse{HostPath: p}, nil
}

func (s *volumesServer) DetachVolume(ctx context.Context, r *nodev1.DetachVolumeRequest) (*nodev1.Empty, error) {
	return done(s.n.DetachVolume(ctx, r.GetHolder(), r.GetVolumeId()))
}

func (s *volumesServer) VolumeRefs(ctx context.Context, _ *nodev1.VolumeRefsRequest) (*nodev1.VolumeRefsResponse, error) {
	refs, err := s.n.VolumeRefs(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &nodev1.VolumeRefsResponse{Refs: make([]*nodev1.VolumeRef, 0, len(refs))}
	for _, r := range refs {
		out.Refs = append(out.Refs, refToProto(r))
	}
	return out, nil
}

type acceleratorsServer struct {
	nodev1.UnimplementedAcceleratorsServer
	n node.Node
}

func (s *acceleratorsServer) AcceleratorInventory(ctx context.Context, _ *nodev1.AcceleratorInventoryRequest) (*nodev1.AcceleratorInventoryResponse, error) {
	devs, err := s.n.AcceleratorInventory(ctx)
	if err != nil {
		return nil, toStatus(err)
	}
	out := &nodev1.AcceleratorInventoryResponse{Devices: make([]*nodev1.Device, 0, len(devs))}
	for _, d := range devs {
		out.Devices = append(out.Devices, deviceToProto(d))
	}
	return out, nil
}

func device(d accel.Device, err error) (*nodev1.Device, error) {
	if err != nil {
		return nil, toStatus(err)
	}
	return deviceToProto(d), nil
}

func (s *acceleratorsServer) Accelerator(ctx context.Context, r *nodev1.DeviceIDRequest) (*nodev1.Device, error) {
	return device(s.n.Accelerator(ctx, r.GetId()))
}

func (s *acceleratorsServer) DisableAccelerator(ctx context.Context, r *nodev1.DisableAcceleratorRequest) (*nodev1.Device, error) {
	return device(s.n.DisableAccelerator(ctx, r.GetId(), r.GetReason()))
}

func (s *acceleratorsServer) EnableAccelerator(ctx context.Context, r *nodev1.DeviceIDRequest) (*nodev1.Device, error) {
	return device(s.n.EnableAccelerator(ctx, r.GetId()))
}

func (s *acceleratorsServer) RecoverAccelerator(ctx context.Context, r *nodev1.DeviceIDRequest) (*nodev1.Device, error) {
	return device(s.n.RecoverAccelerator(ctx, r.GetId()))
}

func (s *acceleratorsServer) DenyAccelerators(ctx context.Context, r *nodev1.DenyAcceleratorsRequest) (*nodev1.Empty, error) {
	return done(s.n.DenyAccelerators(ctx, r.GetSandboxId(), errorFromProto(r.GetReason())))
}

func (s *acceleratorsServer) AcceleratorEvents(ctx context.Context, r *nodev1.AcceleratorEventsRequest) (*nodev1.AcceleratorEventsResponse, error) {
	evs, err := s.n.AcceleratorEvents(ctx, int(r.GetLimit()))
	if err != nil {
		return nil, toStatus(err)
	}
	out := &nodev1.AcceleratorEventsResponse{Events: make([]*nodev1.AcceleratorEvent, 0, len(evs))}
	for _, e := range evs {
		out.Events = append(out.Events, eventToProto(e))
	}
	return out, nil
}

type eventsServer struct {
	nodev1.UnimplementedEventsServer
	n node.Node
}

// Exits sends the node's exits until the caller goes away. The header
// says whether the node watches at all, so the client can return a nil
// channel as the node did.
func (s *eventsServer) Exits(_ *nodev1.ExitsRequest, stream grpc.ServerStreamingServer[nodev1.Exit]) error {
	ctx := stream.Context()
	ch, err := s.n.Exits(ctx)
	if err != nil {
		return toStatus(err)
	}
	watching := "true"
	if ch == nil {
		watching = "false"
	}
	if err := stream.SendHeader(metadata.Pairs(watchingHeader, watching)); err != nil {
		return err
	}
	if ch == nil {
		return nil
	}
	for {
		select {
		case <-ctx.Done():
			return toStatus(ctx.Err())
		case e, ok := <-ch:
			if !ok {
				return nil
			}
			if err := stream.Send(exitToProto(e)); err != nil {
				return err
			}
		}
	}
}
