package main

import (
	"encoding/json"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/accel/acceltest"
)

func TestParseAccelFlag(t *testing.T) {
	r, err := parseAccelFlag("class=gpu,count=2,vendor=nvidia,min-memory-mb=40000,label.model=h100")
	if err != nil || r.Class != accel.ClassGPU || r.Count != 2 || r.Vendor != "nvidia" || r.MinMemoryMB != 40000 || r.Labels["model"] != "h100" {
		t.Fatalf("%+v %v", r, err)
	}
	for _, bad := range []string{"gpu", "count=x", "colour=red", "class=fpga", "count=0"} {
		if _, err := parseAccelFlag(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
	if _, err := parseAccelFlag("count=99"); !errors.Is(err, accel.ErrInvalid) {
		t.Fatalf("count=99: %v", err)
	}
}

func TestGPUHelp(t *testing.T) {
	out, err := run(t, "gpu", "--help")
	if err != nil {
		t.Fatal(err)
	}
	for _, sub := range []string{"list", "disable", "enable", "recover", "events", "discover"} {
		if !strings.Contains(out, sub) {
			t.Errorf("gpu help lacks %q:\n%s", sub, out)
		}
	}
}

// discover runs read-only against a fake host tree and prints JSON.
func TestGPUDiscoverFakeHost(t *testing.T) {
	h := acceltest.NewHost(t, acceltest.GPU{Addr: "0000:3b:00.0", VendorID: "0x10de", DeviceID: "0x2330", Class: "0x030200",
		IOMMUGroup: 12, Driver: "nvidia", Minor: 0, Model: "NVIDIA H100 80GB HBM3", MemoryMB: 81559, UUID: "GPU-aaaa"})
	out, err := run(t, "gpu", "discover", "--sysfs", h.Sysfs, "--proc", h.Proc, "--dev", h.Dev, "--nvidia-smi", filepath.Join(h.Bin, "nvidia-smi"))
	if err != nil {
		t.Fatal(err)
	}
	var devs []accel.Device
	if err := json.Unmarshal([]byte(out), &devs); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if len(devs) != 1 || devs[0].UUID != "GPU-aaaa" || devs[0].CUDAVersion != "12.4" {
		t.Fatalf("discovered %+v", devs)
	}
}

// vfio hands a device to a microVM; with runc (or runsc) it would never reach
// the sandbox, so serve refuses it before it touches the host.
func TestServeRefusesVFIOWithOCIRuntime(t *testing.T) {
	dir := t.TempDir()
	for _, rt := range []string{"runc", "runsc"} {
		_, err := run(t, "serve", "--runtime", rt, "--accel-backend", "vfio", "--data-dir", dir, "--images-dir", dir)
		if !errors.Is(err, errVFIONeedsVM) || !strings.Contains(err.Error(), rt) {
			t.Fatalf("serve --runtime %s --accel-backend vfio: %v, want errVFIONeedsVM", rt, err)
		}
	}
}
