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
