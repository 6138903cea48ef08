package accel_test

import (
	"context"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/accel/acceltest"
)

func TestDiscoverAndPassthrough(t *testing.T) {
	h := acceltest.NewHost(t,
		acceltest.GPU{Addr: "0000:3b:00.0", VendorID: "0x10de", DeviceID: "0x2330", Class: "0x030200", NUMA: 0, IOMMUGroup: 12, Driver: "nvidia", Minor: 0, Model: "NVIDIA H100 80GB HBM3", MemoryMB: 81559, UUID: "GPU-aaaa"},
		acceltest.GPU{Addr: "0000:86:00.0", VendorID: "0x10de", DeviceID: "0x2330", Class: "0x030200", NUMA: 1, IOMMUGroup: 40, Driver: "", Minor: 1, Model: "NVIDIA H100 80GB HBM3", MemoryMB: 81559, UUID: "GPU-bbbb"},
		acceltest.GPU{Addr: "0000:01:00.0", VendorID: "0x8086", DeviceID: "0x1572", Class: "0x020000", IOMMUGroup: 3, Driver: "i40e"},
	)
	devs, err := accel.Discover(context.Background(), h.DiscoverConfig())
	if err != nil {
		t.Fatal(err)
	}
	if len(devs) != 2 {
		t.Fatalf("want the 2 GPUs, not the NIC: %+v", devs)
	}
	d := devs[0]
	if d.ID != "gpu-0000:3b:00.0" || d.Vendor != "nvidia" || d.NUMANode != 0 || d.IOMMUGroup != "12" || d.Driver != "nvidia" ||
		d.Minor != 0 || d.MemoryMB != 81559 || d.DriverVersion != "550.54.15" || d.CUDAVersion != "12.4" || d.UUID != "GPU-aaaa" {
		t.Fatalf("discovered: %+v", d)
	}
	if devs[1].Driver != "" || devs[1].NUMANode != 1 {
		t.Fatalf("second: %+v", devs[1])
	}
	p := accel.NewPassthrough(h.PassthroughConfig())
	if err := p.Validate(&devs[1]); err == nil {
		t.Fatal("an unbound GPU validated")
	}
	if err := p.Validate(&d); err != nil {
		t.Fatal(err)
	}
	att, err := p.Prepare(context.Background(), &d, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	nodes := map[string][2]int64{}
	for _, n := range att.Devices {
		nodes[n.Path] = [2]int64{n.Major, n.Minor}
	}
	if nodes["/dev/nvidia0"] != [2]int64{195, 0} || nodes["/dev/nvidiactl"] != [2]int64{195, 255} || nodes["/dev/nvidia-uvm"] != [2]int64{235, 0} {
		t.Fatalf("device nodes: %+v", att.Devices)
	}
	if len(att.Mounts) < 3 || att.Env["NVIDIA_VISIBLE_DEVICES"] != "GPU-aaaa" {
		t.Fatalf("mounts/env: %+v", att)
	}
	obs, err := p.Observe(&d)
	if err != nil || !obs.Present || obs.Driver != "nvidia" || len(obs.Holders) != 0 {
		t.Fatalf("observe: %+v %v", obs, err)
	}
}

// AMD devices are found by their DRM render node and passed through as
// /dev/kfd + /dev/dri/renderD*, with the card node when present.
func TestDiscoverAMD(t *testing.T) {
	h := acceltest.NewHost(t,
		acceltest.GPU{Addr: "0000:c1:00.0", VendorID: "0x1002", DeviceID: "0x74a1", Class: "0x038000", NUMA: 1, IOMMUGroup: 7, Driver: "amdgpu", Minor: 129},
		acceltest.GPU{Addr: "0000:c2:00.0", VendorID: "0x1002", DeviceID: "0x74a1", Class: "0x030200", NUMA: 1, IOMMUGroup: 8, Driver: "amdgpu", Minor: 130},
	)
	devs, err := accel.Discover(context.Background(), h.DiscoverConfig())
	if err != nil {
		t.Fatal(err)
	}
	// 0x0380 (display controller "other") is not a GPU class we take.
	if len(devs) != 1 {
		t.Fatalf("want only the 0x0302 device: %+v", devs)
	}
	d := devs[0]
	if d.ID != "gpu-0000:c2:00.0" || d.Vendor != "amd" || d.Minor != 130 || d.Driver != "amdgpu" || d.Labels["vendor"] != "amd" || d.Labels["cuda"] != "" {
		t.Fatalf("amd device: %+v", d)
	}
	p := accel.NewPassthrough(h.PassthroughConfig())
	if p.ExpectedDriver(&d) != "amdgpu" {
		t.Fatalf("expected driver %q", p.ExpectedDriver(&d))
	}
	if err := p.Validate(&d); err != nil {
		t.Fatal(err)
	}
	att, err := p.Prepare(context.Background(), &d, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	paths := map[string][2]int64{}
	for _, n := range att.Devices {
		paths[n.Path] = [2]int64{n.Major, n.Minor}
	}
	if paths["/dev/kfd"] != [2]int64{234, 0} || paths["/dev/dri/renderD130"] != [2]int64{226, 130} || paths["/dev/dri/card2"] != [2]int64{226, 2} || len(paths) != 3 {
		t.Fatalf("amd nodes: %+v", att.Devices)
	}
	if len(att.Mounts) != 0 || att.Env["NVIDIA_VISIBLE_DEVICES"] != "" {
		t.Fatalf("amd attachment carries nvidia bits: %+v", att)
	}
	d.Minor = -1
	if err := p.Validate(&d); err == nil {
		t.Fatal("amd without render node validated")
	}
}
