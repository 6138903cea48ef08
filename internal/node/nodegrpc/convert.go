package nodegrpc

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	nodev1 "github.com/cubicle-dev/cubicle/api/proto/node/v1"
	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/phase"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// The conversions mirror the Go structs field by field; nil and empty are
// kept apart wherever Go gives them different meanings (Info.Accelerators,
// Policy.Upstream, Policy.DNSServers, CreateRequest.AccelContract).

// ts and fromTS keep the zero time.Time zero (timestamppb's nil reads as
// the Unix epoch).
func ts(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func fromTS(t *timestamppb.Timestamp) time.Time {
	if t == nil {
		return time.Time{}
	}
	return t.AsTime()
}

func infoToProto(i node.Info) *nodev1.NodeInfo {
	p := &nodev1.NodeInfo{
		Id: i.ID, Version: i.Version, Runtime: i.Runtime,
		Abilities: &nodev1.Abilities{
			Snapshots: i.Abilities.Snapshots, MemorySnapshots: i.Abilities.MemorySnapshots,
			EnforcesDomains: i.Abilities.EnforcesDomains, EgressProxy: i.Abilities.EgressProxy,
			PullsImages: i.Abilities.PullsImages,
		},
		VolumeDrivers: i.VolumeDrivers,
		Capacity:      &nodev1.Capacity{Cpus: int64(i.Capacity.CPUs), MemoryBytes: i.Capacity.MemoryBytes},
	}
	if i.Accelerators != nil {
		p.Accelerators = &nodev1.AcceleratorCounts{ByState: make(map[string]int64, len(i.Accelerators))}
		for s, n := range i.Accelerators {
			p.Accelerators.ByState[string(s)] = int64(n)
		}
	}
	for _, im := range i.Images {
		p.Images = append(p.Images, &nodev1.Image{Name: im.Name, Digest: im.Digest})
	}
	return p
}

// imageToProto: an unset message is the zero Image (a create by layers).
func imageToProto(i node.Image) *nodev1.Image {
	if i.IsZero() {
		return nil
	}
	return &nodev1.Image{Name: i.Name, Digest: i.Digest}
}

func imageFromProto(p *nodev1.Image) node.Image {
	return node.Image{Name: p.GetName(), Digest: p.GetDigest()}
}

func infoFromProto(p *nodev1.NodeInfo) node.Info {
	a, c := p.GetAbilities(), p.GetCapacity()
	i := node.Info{
		ID: p.GetId(), Version: p.GetVersion(), Runtime: p.GetRuntime(),
		Abilities: node.Abilities{
			Snapshots: a.GetSnapshots(), MemorySnapshots: a.GetMemorySnapshots(),
			EnforcesDomains: a.GetEnforcesDomains(), EgressProxy: a.GetEgressProxy(),
			PullsImages: a.GetPullsImages(),
		},
		VolumeDrivers: p.GetVolumeDrivers(),
		Capacity:      node.Capacity{CPUs: int(c.GetCpus()), MemoryBytes: c.GetMemoryBytes()},
	}
	if p.Accelerators != nil {
		i.Accelerators = make(map[accel.State]int, len(p.Accelerators.ByState))
		for s, n := range p.Accelerators.ByState {
			i.Accelerators[accel.State(s)] = int(n)
		}
	}
	for _, im := range p.GetImages() {
		i.Images = append(i.Images, imageFromProto(im))
	}
	return i
}

func createToProto(r node.CreateRequest) *nodev1.CreateRequest {
	p := &nodev1.CreateRequest{
		Id: r.ID, Layers: r.Layers, EnvdToken: r.EnvdToken, EnvVars: r.EnvVars, DefaultUser: r.DefaultUser,
		CpuCount: int64(r.CPUCount), MemoryMb: int64(r.MemoryMB), DiskSizeMb: int64(r.DiskSizeMB),
		Policy:   policyToProto(r.Policy),
		StartCmd: r.StartCmd, StartUser: r.StartUser, StartWorkdir: r.StartWorkdir, DefaultWorkdir: r.DefaultWorkdir,
		Restore: r.Restore, CurrentToken: r.CurrentToken, Image: imageToProto(r.Image),
		SnapshotLayers: r.SnapshotLayers, RestoreSnapshot: r.RestoreSnapshot,
	}
	for _, m := range r.Mounts {
		p.Mounts = append(p.Mounts, &nodev1.Mount{Source: m.Source, Destination: m.Destination, ReadOnly: m.ReadOnly, Under: m.Under})
	}
	for _, v := range r.Volumes {
		p.Volumes = append(p.Volumes, attachmentToProto(v))
	}
	for _, a := range r.Accelerators {
		p.Accelerators = append(p.Accelerators, &nodev1.AcceleratorRequest{
			Class: string(a.Class), Count: int64(a.Count), Labels: a.Labels, Backend: string(a.Backend),
			MinMemoryMb: a.MinMemoryMB, Vendor: a.Vendor,
		})
	}
	if c := r.AccelContract; c != nil {
		p.AccelContract = &nodev1.AcceleratorContract{
			Class: string(c.Class), Count: int64(c.Count), Labels: c.Labels, Backend: string(c.Backend),
			Vendor: c.Vendor, MinMemoryMb: c.MinMemoryMB, DriverVersion: c.DriverVersion, CudaVersion: c.CUDAVersion,
			GuestKernel: c.GuestKernel, ModulesImage: c.ModulesImage, PinMemory: c.PinMemory,
			Libraries: c.Libraries, Check: c.Check,
		}
	}
	return p
}

func createFromProto(p *nodev1.CreateRequest) node.CreateRequest {
	r := node.CreateRequest{
		ID: p.GetId(), Layers: p.GetLayers(), EnvdToken: p.GetEnvdToken(), EnvVars: p.GetEnvVars(),
		DefaultUser: p.GetDefaultUser(), CPUCount: int(p.GetCpuCount()), MemoryMB: int(p.GetMemoryMb()),
		DiskSizeMB: int(p.GetDiskSizeMb()), Policy: policyFromProto(p.GetPolicy()),
		StartCmd: p.GetStartCmd(), StartUser: p.GetStartUser(), StartWorkdir: p.GetStartWorkdir(),
		DefaultWorkdir: p.GetDefaultWorkdir(), Restore: p.GetRestore(), CurrentToken: p.GetCurrentToken(),
		Image: imageFromProto(p.GetImage()), SnapshotLayers: p.GetSnapshotLayers(), RestoreSnapshot: p.GetRestoreSnapshot(),
	}
	for _, m := range p.GetMounts() {
		r.Mounts = append(r.Mounts, runtime.Mount{Source: m.GetSource(), Destination: m.GetDestination(), ReadOnly: m.GetReadOnly(), Under: m.GetUnder()})
	}
	for _, v := range p.GetVolumes() {
		r.Volumes = append(r.Volumes, attachmentFromProto(v))
	}
	for _, a := range p.GetAccelerators() {
		r.Accelerators = append(r.Accelerators, accel.Request{
			Class: accel.Class(a.GetClass()), Count: int(a.GetCount()), Labels: a.GetLabels(),
			Backend: accel.BackendType(a.GetBackend()), MinMemoryMB: a.GetMinMemoryMb(), Vendor: a.GetVendor(),
		})
	}
	if c := p.GetAccelContract(); c != nil {
		r.AccelContract = &accel.Contract{
			Class: accel.Class(c.GetClass()), Count: int(c.GetCount()), Labels: c.GetLabels(),
			Backend: accel.BackendType(c.GetBackend()), Vendor: c.GetVendor(), MinMemoryMB: c.GetMinMemoryMb(),
			DriverVersion: c.GetDriverVersion(), CUDAVersion: c.GetCudaVersion(), GuestKernel: c.GetGuestKernel(),
			ModulesImage: c.GetModulesImage(), PinMemory: c.GetPinMemory(), Libraries: c.GetLibraries(), Check: c.GetCheck(),
		}
	}
	return r
}

func policyToProto(p network.Policy) *nodev1.Policy {
	out := &nodev1.Policy{AllowInternet: p.AllowInternet, AllowOut: p.AllowOut, DenyOut: p.DenyOut}
	if p.Rules != nil {
		out.Rules = make(map[string]*nodev1.Rules, len(p.Rules))
		for host, rs := range p.Rules {
			l := &nodev1.Rules{}
			for _, r := range rs {
				l.Rules = append(l.Rules, &nodev1.Rule{Headers: r.Headers, Plain: r.Plain, Port: uint32(r.Port)})
			}
			out.Rules[host] = l
		}
	}
	if u := p.Upstream; u != nil {
		out.Upstream = &nodev1.Upstream{Address: u.Address, Username: u.Username, Password: u.Password}
		if u.TLS != nil {
			out.Upstream.Tls = &nodev1.UpstreamTLS{ServerName: u.TLS.ServerName, CaCert: u.TLS.CACert}
		}
	}
	if p.DNSServers != nil {
		out.DnsServers = &nodev1.DNSServers{Servers: *p.DNSServers}
	}
	return out
}

func policyFromProto(p *nodev1.Policy) network.Policy {
	out := network.Policy{AllowInternet: p.GetAllowInternet(), AllowOut: p.GetAllowOut(), DenyOut: p.GetDenyOut()}
	if p.GetRules() != nil {
		out.Rules = make(map[string][]network.Rule, len(p.GetRules()))
		for host, l := range p.GetRules() {
			rs := make([]network.Rule, 0, len(l.GetRules()))
			for _, r := range l.GetRules() {
				rs = append(rs, network.Rule{Headers: r.GetHeaders(), Plain: r.GetPlain(), Port: uint16(min(r.GetPort(), 65535))})
			}
			out.Rules[host] = rs
		}
	}
	if u := p.GetUpstream(); u != nil {
		out.Upstream = &network.Upstream{Address: u.GetAddress(), Username: u.GetUsername(), Password: u.GetPassword()}
		if t := u.GetTls(); t != nil {
			out.Upstream.TLS = &network.UpstreamTLS{ServerName: t.GetServerName(), CACert: t.GetCaCert()}
		}
	}
	if d := p.GetDnsServers(); d != nil {
		s := append([]string{}, d.GetServers()...)
		out.DNSServers = &s
	}
	return out
}

func sandboxToProto(s node.Sandbox) *nodev1.Sandbox {
	p := &nodev1.Sandbox{Id: s.ID, State: string(s.State), Pid: int64(s.Pid)}
	if s.Addr.IsValid() {
		p.Addr = s.Addr.String()
	}
	return p
}

func sandboxFromProto(p *nodev1.Sandbox) (node.Sandbox, error) {
	s := node.Sandbox{ID: p.GetId(), State: runtime.State(p.GetState()), Pid: int(p.GetPid())}
	if a := p.GetAddr(); a != "" {
		addr, err := netip.ParseAddr(a)
		if err != nil {
			return node.Sandbox{}, fmt.Errorf("nodegrpc: sandbox %s: bad address from node: %w", s.ID, err)
		}
		s.Addr = addr
	}
	return s, nil
}

func statsToProto(s node.Stats) *nodev1.Stats {
	return &nodev1.Stats{
		Time: ts(s.Time), CpuCount: int64(s.CPUCount), CpuUsedPct: s.CPUUsedPct, MemUsed: s.MemUsed,
		MemTotal: s.MemTotal, MemCache: s.MemCache, DiskUsed: s.DiskUsed, DiskTotal: s.DiskTotal,
	}
}

func statsFromProto(p *nodev1.Stats) node.Stats {
	return node.Stats{
		Time: fromTS(p.GetTime()), CPUCount: int(p.GetCpuCount()), CPUUsedPct: p.GetCpuUsedPct(), MemUsed: p.GetMemUsed(),
		MemTotal: p.GetMemTotal(), MemCache: p.GetMemCache(), DiskUsed: p.GetDiskUsed(), DiskTotal: p.GetDiskTotal(),
	}
}

func snapshotToProto(s node.Snapshot) *nodev1.Snapshot {
	return &nodev1.Snapshot{Id: s.ID, Kind: s.Kind, Layer: s.Layer, Checkpoint: s.Checkpoint, SizeBytes: s.SizeBytes}
}

func snapshotFromProto(p *nodev1.Snapshot) node.Snapshot {
	return node.Snapshot{ID: p.GetId(), Kind: p.GetKind(), Layer: p.GetLayer(), Checkpoint: p.GetCheckpoint(), SizeBytes: p.GetSizeBytes()}
}

func attachmentToProto(v node.VolumeAttachment) *nodev1.VolumeAttachment {
	return &nodev1.VolumeAttachment{VolumeId: v.VolumeID, Driver: v.Driver, PrivateData: v.PrivateData, Path: v.Path, ReadOnly: v.ReadOnly}
}

func attachmentFromProto(p *nodev1.VolumeAttachment) node.VolumeAttachment {
	return node.VolumeAttachment{VolumeID: p.GetVolumeId(), Driver: p.GetDriver(), PrivateData: p.GetPrivateData(), Path: p.GetPath(), ReadOnly: p.GetReadOnly()}
}

func refToProto(r node.VolumeRef) *nodev1.VolumeRef {
	return &nodev1.VolumeRef{
		VolumeId: r.VolumeID, Holder: r.Holder, Kind: r.Kind, Driver: r.Driver, State: r.State, HostPath: r.HostPath,
		Metadata: r.Metadata, Path: r.Path, ReadOnly: r.ReadOnly, UpdatedAt: ts(r.UpdatedAt),
	}
}

func refFromProto(p *nodev1.VolumeRef) node.VolumeRef {
	return node.VolumeRef{
		VolumeID: p.GetVolumeId(), Holder: p.GetHolder(), Kind: p.GetKind(), Driver: p.GetDriver(), State: p.GetState(),
		HostPath: p.GetHostPath(), Metadata: p.GetMetadata(), Path: p.GetPath(), ReadOnly: p.GetReadOnly(),
		UpdatedAt: fromTS(p.GetUpdatedAt()),
	}
}

func deviceToProto(d accel.Device) *nodev1.Device {
	return &nodev1.Device{
		Id: d.ID, Class: string(d.Class), Vendor: d.Vendor, VendorId: d.VendorID, DeviceId: d.DeviceID, Model: d.Model,
		MemoryMb: d.MemoryMB, Labels: d.Labels, Allocation: string(d.Allocation), Backend: string(d.Backend),
		Health: string(d.Health), NumaNode: int64(d.NUMANode), PciAddress: d.PCIAddress, IommuGroup: d.IOMMUGroup,
		Driver: d.Driver, DriverVersion: d.DriverVersion, CudaVersion: d.CUDAVersion, Uuid: d.UUID, Minor: int64(d.Minor),
		State: string(d.State), Reason: d.Reason, SandboxId: d.SandboxID, Since: ts(d.Since),
	}
}

func deviceFromProto(p *nodev1.Device) accel.Device {
	return accel.Device{
		ID: p.GetId(), Class: accel.Class(p.GetClass()), Vendor: p.GetVendor(), VendorID: p.GetVendorId(),
		DeviceID: p.GetDeviceId(), Model: p.GetModel(), MemoryMB: p.GetMemoryMb(), Labels: p.GetLabels(),
		Allocation: accel.AllocationMode(p.GetAllocation()), Backend: accel.BackendType(p.GetBackend()),
		Health: accel.Health(p.GetHealth()), NUMANode: int(p.GetNumaNode()), PCIAddress: p.GetPciAddress(),
		IOMMUGroup: p.GetIommuGroup(), Driver: p.GetDriver(), DriverVersion: p.GetDriverVersion(),
		CUDAVersion: p.GetCudaVersion(), UUID: p.GetUuid(), Minor: int(p.GetMinor()), State: accel.State(p.GetState()),
		Reason: p.GetReason(), SandboxID: p.GetSandboxId(), Since: fromTS(p.GetSince()),
	}
}

func eventToProto(e accel.Event) *nodev1.AcceleratorEvent {
	return &nodev1.AcceleratorEvent{Time: ts(e.Time), Type: e.Type, Device: e.Device, Sandbox: e.Sandbox, From: e.From, To: e.To, Reason: e.Reason}
}

func eventFromProto(p *nodev1.AcceleratorEvent) accel.Event {
	return accel.Event{Time: fromTS(p.GetTime()), Type: p.GetType(), Device: p.GetDevice(), Sandbox: p.GetSandbox(), From: p.GetFrom(), To: p.GetTo(), Reason: p.GetReason()}
}

func exitToProto(e node.Exit) *nodev1.Exit {
	return &nodev1.Exit{Id: e.ID, Pid: int64(e.Pid), At: ts(e.At), Oom: e.OOM}
}

func exitFromProto(p *nodev1.Exit) node.Exit {
	return node.Exit{ID: p.GetId(), Pid: int(p.GetPid()), At: fromTS(p.GetAt()), OOM: p.GetOom()}
}

func phasesToProto(ps []phase.Phase) []*nodev1.Phase {
	out := make([]*nodev1.Phase, len(ps))
	for i, p := range ps {
		out[i] = &nodev1.Phase{Name: p.Name, Nanos: int64(p.Duration)}
	}
	return out
}

// phasesFromProto keeps only the known phases: a node's answer must not
// grow the control plane's histogram with label values it invents.
func phasesFromProto(ps []*nodev1.Phase) []phase.Phase {
	out := make([]phase.Phase, 0, len(ps))
	for _, p := range ps {
		if slices.Contains(phase.Names, p.GetName()) && p.GetNanos() >= 0 {
			out = append(out, phase.Phase{Name: p.GetName(), Duration: time.Duration(p.GetNanos())})
		}
	}
	return out
}
