package nodegrpc

import (
	"context"
	"errors"
	"io"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	nodev1 "github.com/cubicle-dev/cubicle/api/proto/node/v1"
	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/phase"
)

// Client is a node.Node whose node is at the other end of a gRPC
// connection. Every error is the node's, brought back with its class,
// sentinel and typed fields (fromStatus); the caller's context (deadline,
// cancellation) goes with every call.
type Client struct {
	info  nodev1.InfoClient
	sb    nodev1.SandboxesClient
	agent nodev1.AgentClient
	net   nodev1.NetworkClient
	snap  nodev1.SnapshotsClient
	vol   nodev1.VolumesClient
	acc   nodev1.AcceleratorsClient
	ev    nodev1.EventsClient
	img   nodev1.ImagesClient
	// opts raise gRPC's 4 MiB receive limit to MaxMessageSize on every
	// call, so a connection made without them still reads a full Logs reply.
	opts []grpc.CallOption
}

var _ node.Node = (*Client)(nil)

// NewClient is a node.Node over cc (made by the caller, with its own
// transport credentials).
func NewClient(cc grpc.ClientConnInterface) *Client {
	return &Client{
		info: nodev1.NewInfoClient(cc), sb: nodev1.NewSandboxesClient(cc), agent: nodev1.NewAgentClient(cc),
		net: nodev1.NewNetworkClient(cc), snap: nodev1.NewSnapshotsClient(cc), vol: nodev1.NewVolumesClient(cc),
		acc: nodev1.NewAcceleratorsClient(cc), ev: nodev1.NewEventsClient(cc), img: nodev1.NewImagesClient(cc),
		opts: []grpc.CallOption{grpc.MaxCallRecvMsgSize(MaxMessageSize), grpc.MaxCallSendMsgSize(MaxMessageSize)},
	}
}

// Info implements node.Node.
func (c *Client) Info(ctx context.Context) (node.Info, error) {
	p, err := c.info.Info(ctx, &nodev1.InfoRequest{}, c.opts...)
	if err != nil {
		return node.Info{}, fromStatus(err)
	}
	return infoFromProto(p), nil
}

func sandbox(p *nodev1.Sandbox, err error) (node.Sandbox, error) {
	if err != nil {
		return node.Sandbox{}, fromStatus(err)
	}
	return sandboxFromProto(p)
}

// hostMounts refuses a request with host mounts: their directories are the
// control plane's host's, so only its own node makes them (the control
// plane pins such sandboxes there; this is the backstop).
func hostMounts(req node.CreateRequest) error {
	for _, m := range req.Mounts {
		if m.Under != "" {
			return node.ErrHostMountsRemote
		}
	}
	return nil
}

func (c *Client) Create(ctx context.Context, req node.CreateRequest) (node.Sandbox, error) {
	if err := hostMounts(req); err != nil {
		return node.Sandbox{}, err
	}
	p, err := c.sb.Create(ctx, createToProto(req), c.opts...)
	if err == nil {
		tr := phase.From(ctx)
		tr.Merge(phasesFromProto(p.GetPhases()))
		if rt := p.GetRuntime(); rt != "" {
			tr.SetRuntime(rt)
		}
	}
	return sandbox(p, err)
}

func (c *Client) Delete(ctx context.Context, id string) error {
	_, err := c.sb.Delete(ctx, &nodev1.IDRequest{Id: id}, c.opts...)
	return fromStatus(err)
}

func (c *Client) Pause(ctx context.Context, id string) error {
	_, err := c.sb.Pause(ctx, &nodev1.IDRequest{Id: id}, c.opts...)
	return fromStatus(err)
}

func (c *Client) Resume(ctx context.Context, id string, req node.CreateRequest) error {
	if err := hostMounts(req); err != nil {
		return err
	}
	_, err := c.sb.Resume(ctx, &nodev1.ResumeRequest{Id: id, Request: createToProto(req)}, c.opts...)
	return fromStatus(err)
}

func (c *Client) Stop(ctx context.Context, id string) error {
	_, err := c.sb.Stop(ctx, &nodev1.IDRequest{Id: id}, c.opts...)
	return fromStatus(err)
}

func (c *Client) Rebuild(ctx context.Context, id string, req node.CreateRequest) error {
	if err := hostMounts(req); err != nil {
		return err
	}
	_, err := c.sb.Rebuild(ctx, &nodev1.RebuildRequest{Id: id, Request: createToProto(req)}, c.opts...)
	return fromStatus(err)
}

func (c *Client) Get(ctx context.Context, id string) (node.Sandbox, error) {
	return sandbox(c.sb.Get(ctx, &nodev1.IDRequest{Id: id}, c.opts...))
}

func (c *Client) List(ctx context.Context) ([]node.Sandbox, error) {
	p, err := c.sb.List(ctx, &nodev1.ListRequest{}, c.opts...)
	if err != nil {
		return nil, fromStatus(err)
	}
	out := make([]node.Sandbox, 0, len(p.GetSandboxes()))
	for _, s := range p.GetSandboxes() {
		sb, err := sandboxFromProto(s)
		if err != nil {
			return nil, err
		}
		out = append(out, sb)
	}
	return out, nil
}

func (c *Client) Stats(ctx context.Context, id, token string) (node.Stats, error) {
	p, err := c.sb.Stats(ctx, &nodev1.StatsRequest{Id: id, Token: token}, c.opts...)
	if err != nil {
		return node.Stats{}, fromStatus(err)
	}
	return statsFromProto(p), nil
}

func (c *Client) Logs(ctx context.Context, id string) ([]byte, error) {
	p, err := c.sb.Logs(ctx, &nodev1.IDRequest{Id: id}, c.opts...)
	if err != nil {
		return nil, fromStatus(err)
	}
	return p.GetData(), nil
}

func (c *Client) Reinit(ctx context.Context, id string, req node.CreateRequest, currentToken string) error {
	_, err := c.agent.Reinit(ctx, &nodev1.ReinitRequest{Id: id, Request: createToProto(req), CurrentToken: currentToken}, c.opts...)
	return fromStatus(err)
}

// Run returns -1 with an error, as Local does.
func (c *Client) Run(ctx context.Context, id, token, user, cmd string) (int, error) {
	p, err := c.agent.Run(ctx, &nodev1.RunRequest{Id: id, Token: token, User: user, Cmd: cmd}, c.opts...)
	if err != nil {
		return -1, fromStatus(err)
	}
	return int(p.GetExitCode()), nil
}

func (c *Client) UpdatePolicy(ctx context.Context, id string, p network.Policy) error {
	_, err := c.net.UpdatePolicy(ctx, &nodev1.UpdatePolicyRequest{Id: id, Policy: policyToProto(p)}, c.opts...)
	return fromStatus(err)
}

func (c *Client) CheckUpstream(ctx context.Context, address string) error {
	_, err := c.net.CheckUpstream(ctx, &nodev1.CheckUpstreamRequest{Address: address}, c.opts...)
	return fromStatus(err)
}

func (c *Client) Snapshot(ctx context.Context, id, snapshotID string) (node.Snapshot, error) {
	p, err := c.snap.Snapshot(ctx, &nodev1.SnapshotRequest{Id: id, SnapshotId: snapshotID}, c.opts...)
	if err != nil {
		return node.Snapshot{}, fromStatus(err)
	}
	return snapshotFromProto(p), nil
}

func (c *Client) DeleteSnapshot(ctx context.Context, snapshotID string) error {
	_, err := c.snap.DeleteSnapshot(ctx, &nodev1.DeleteSnapshotRequest{SnapshotId: snapshotID}, c.opts...)
	return fromStatus(err)
}

func (c *Client) Snapshots(ctx context.Context) ([]string, error) {
	p, err := c.snap.Snapshots(ctx, &nodev1.ListSnapshotsRequest{}, c.opts...)
	if err != nil {
		return nil, fromStatus(err)
	}
	return p.GetSnapshotIds(), nil
}

func (c *Client) PushSnapshot(ctx context.Context, snapshotID string, targets []node.SnapshotObject) ([]node.SnapshotObject, error) {
	p, err := c.snap.PushSnapshot(ctx, &nodev1.PushSnapshotRequest{SnapshotId: snapshotID, Targets: objectsToProto(targets)}, c.opts...)
	if err != nil {
		return nil, fromStatus(err)
	}
	return objectsFromProto(p.GetObjects()), nil
}

func (c *Client) FetchSnapshot(ctx context.Context, snapshotID string, sources []node.SnapshotObject) error {
	_, err := c.snap.FetchSnapshot(ctx, &nodev1.FetchSnapshotRequest{SnapshotId: snapshotID, Sources: objectsToProto(sources)}, c.opts...)
	return fromStatus(err)
}

func objectsToProto(in []node.SnapshotObject) []*nodev1.SnapshotObject {
	out := make([]*nodev1.SnapshotObject, 0, len(in))
	for _, o := range in {
		out = append(out, &nodev1.SnapshotObject{Part: o.Part, Url: o.URL, Digest: o.Digest, Size: o.Size})
	}
	return out
}

func objectsFromProto(in []*nodev1.SnapshotObject) []node.SnapshotObject {
	out := make([]node.SnapshotObject, 0, len(in))
	for _, o := range in {
		out = append(out, node.SnapshotObject{Part: o.GetPart(), URL: o.GetUrl(), Digest: o.GetDigest(), Size: o.GetSize()})
	}
	return out
}

// PullImage implements node.Node.
func (c *Client) PullImage(ctx context.Context, image node.Image) error {
	_, err := c.img.PullImage(ctx, &nodev1.PullImageRequest{Image: imageToProto(image)}, c.opts...)
	return fromStatus(err)
}

func (c *Client) AttachVolume(ctx context.Context, holder string, v node.VolumeAttachment) (string, error) {
	p, err := c.vol.AttachVolume(ctx, &nodev1.AttachVolumeRequest{Holder: holder, Attachment: attachmentToProto(v)}, c.opts...)
	if err != nil {
		return "", fromStatus(err)
	}
	return p.GetHostPath(), nil
}

func (c *Client) DetachVolume(ctx context.Context, holder, volumeID string) error {
	_, err := c.vol.DetachVolume(ctx, &nodev1.DetachVolumeRequest{Holder: holder, VolumeId: volumeID}, c.opts...)
	return fromStatus(err)
}

func (c *Client) VolumeRefs(ctx context.Context) ([]node.VolumeRef, error) {
	p, err := c.vol.VolumeRefs(ctx, &nodev1.VolumeRefsRequest{}, c.opts...)
	if err != nil {
		return nil, fromStatus(err)
	}
	out := make([]node.VolumeRef, 0, len(p.GetRefs()))
	for _, r := range p.GetRefs() {
		out = append(out, refFromProto(r))
	}
	return out, nil
}

func (c *Client) AcceleratorInventory(ctx context.Context) ([]accel.Device, error) {
	p, err := c.acc.AcceleratorInventory(ctx, &nodev1.AcceleratorInventoryRequest{}, c.opts...)
	if err != nil {
		return nil, fromStatus(err)
	}
	out := make([]accel.Device, 0, len(p.GetDevices()))
	for _, d := range p.GetDevices() {
		out = append(out, deviceFromProto(d))
	}
	return out, nil
}

func deviceOf(p *nodev1.Device, err error) (accel.Device, error) {
	if err != nil {
		return accel.Device{}, fromStatus(err)
	}
	return deviceFromProto(p), nil
}

func (c *Client) Accelerator(ctx context.Context, id string) (accel.Device, error) {
	return deviceOf(c.acc.Accelerator(ctx, &nodev1.DeviceIDRequest{Id: id}, c.opts...))
}

func (c *Client) DisableAccelerator(ctx context.Context, id, reason string) (accel.Device, error) {
	return deviceOf(c.acc.DisableAccelerator(ctx, &nodev1.DisableAcceleratorRequest{Id: id, Reason: reason}, c.opts...))
}

func (c *Client) EnableAccelerator(ctx context.Context, id string) (accel.Device, error) {
	return deviceOf(c.acc.EnableAccelerator(ctx, &nodev1.DeviceIDRequest{Id: id}, c.opts...))
}

func (c *Client) RecoverAccelerator(ctx context.Context, id string) (accel.Device, error) {
	return deviceOf(c.acc.RecoverAccelerator(ctx, &nodev1.DeviceIDRequest{Id: id}, c.opts...))
}

func (c *Client) DenyAccelerators(ctx context.Context, sandboxID string, reason error) error {
	_, err := c.acc.DenyAccelerators(ctx, &nodev1.DenyAcceleratorsRequest{SandboxId: sandboxID, Reason: errorToProto(reason)}, c.opts...)
	return fromStatus(err)
}

func (c *Client) AcceleratorEvents(ctx context.Context, limit int) ([]accel.Event, error) {
	p, err := c.acc.AcceleratorEvents(ctx, &nodev1.AcceleratorEventsRequest{Limit: int64(limit)}, c.opts...)
	if err != nil {
		return nil, fromStatus(err)
	}
	out := make([]accel.Event, 0, len(p.GetEvents()))
	for _, e := range p.GetEvents() {
		out = append(out, eventFromProto(e))
	}
	return out, nil
}

// Exit stream reconnection: a stream broken by the transport (the node
// restarting, a connection reset) is opened again, waiting from
// exitsRetryMin doubling to exitsRetryMax, until ctx ends. Exits missed
// meanwhile are found by the control plane's periodic reconcile.
const (
	exitsRetryMin = 100 * time.Millisecond
	exitsRetryMax = 5 * time.Second
)

// Exits implements node.Events over a server stream. The first stream is
// opened before it returns, so the node's refusal is its error, and a node
// that does not watch gives a nil channel as it would in-process. The
// channel closes when ctx ends or the node ends the stream.
func (c *Client) Exits(ctx context.Context) (<-chan node.Exit, error) {
	stream, watching, err := c.openExits(ctx)
	if err != nil {
		return nil, err
	}
	if !watching {
		return nil, nil
	}
	ch := make(chan node.Exit)
	go c.pumpExits(ctx, stream, ch)
	return ch, nil
}

func (c *Client) openExits(ctx context.Context) (grpc.ServerStreamingClient[nodev1.Exit], bool, error) {
	stream, err := c.ev.Exits(ctx, &nodev1.ExitsRequest{}, c.opts...)
	if err != nil {
		return nil, false, fromStatus(err)
	}
	// Header waits for the server's first word: its header, or its error.
	md, err := stream.Header()
	if err != nil {
		return nil, false, fromStatus(err)
	}
	if v := md.Get(watchingHeader); len(v) == 0 {
		// A stream ended with an error sends no header: Recv has the status.
		if _, err := stream.Recv(); err != nil && !errors.Is(err, io.EOF) {
			return nil, false, fromStatus(err)
		}
		return nil, false, fromStatus(status.Error(codes.Internal, "nodegrpc: exit stream without its header"))
	} else if v[0] != "true" {
		return nil, false, nil
	}
	return stream, true, nil
}

func (c *Client) pumpExits(ctx context.Context, stream grpc.ServerStreamingClient[nodev1.Exit], ch chan<- node.Exit) {
	defer close(ch)
	wait := exitsRetryMin
	for {
		e, err := stream.Recv()
		if err == nil {
			wait = exitsRetryMin
			select {
			case ch <- exitFromProto(e):
				continue
			case <-ctx.Done():
				return
			}
		}
		// The node ended the stream, or ctx did: the channel's life is over.
		if ctx.Err() != nil || status.Code(err) != codes.Unavailable {
			return
		}
		for {
			t := time.NewTimer(wait)
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-t.C:
			}
			wait = min(wait*2, exitsRetryMax)
			s, watching, err := c.openExits(ctx)
			if err == nil {
				if !watching {
					return
				}
				stream = s
				break
			}
			if ctx.Err() != nil || errdefs.Code(err) != codes.Unavailable {
				return
			}
		}
	}
}
