package accel_test

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/accel/acceltest"
)

var h100 = acceltest.GPU{Addr: "0000:3b:00.0", VendorID: "0x10de", DeviceID: "0x2330", Class: "0x030200", IOMMUGroup: 12,
	Driver: "nvidia", Minor: 0, Model: "NVIDIA H100 80GB HBM3", MemoryMB: 81559, UUID: "GPU-aaaa"}

func discoverOne(t *testing.T, h *acceltest.Host, addr string) accel.Device {
	t.Helper()
	devs, err := accel.Discover(context.Background(), h.DiscoverConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range devs {
		if d.PCIAddress == addr {
			return d
		}
	}
	t.Fatalf("%s not discovered in %+v", addr, devs)
	return accel.Device{}
}

func driverOf(h *acceltest.Host, addr string) string {
	t, err := os.Readlink(filepath.Join(h.Sysfs, "bus/pci/devices", addr, "driver"))
	if err != nil {
		return ""
	}
	return filepath.Base(t)
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// The whole VFIO round trip on a fake tree: nvidia → vfio-pci (group node
// appears, driver_override set) → back to nvidia with driver_override cleared.
func TestVFIORoundTrip(t *testing.T) {
	h := acceltest.NewHost(t, h100)
	d := discoverOne(t, h, h100.Addr)
	v := accel.NewVFIO(h.VFIOConfig(true))
	if err := v.Validate(&d); err != nil {
		t.Fatal(err)
	}
	if d.Labels[accel.HostDriverLabel] != "nvidia" || v.ExpectedDriver(&d) != "nvidia" {
		t.Fatalf("host driver not recorded: %+v", d.Labels)
	}
	att, err := v.Prepare(context.Background(), &d, "sb1")
	if err != nil {
		t.Fatal(err)
	}
	if len(att.VFIOGroups) != 1 || att.VFIOGroups[0] != "/dev/vfio/12" || att.Env["CUBICLE_ACCELERATORS"] != d.ID {
		t.Fatalf("attachment: %+v", att)
	}
	if got := driverOf(h, h100.Addr); got != "vfio-pci" {
		t.Fatalf("driver after prepare: %q", got)
	}
	override := filepath.Join(h.Sysfs, "bus/pci/devices", h100.Addr, "driver_override")
	if readFile(t, override) != "vfio-pci" {
		t.Fatal("driver_override not set")
	}
	if obs, err := v.Observe(&d); err != nil || !obs.Present || obs.Driver != "vfio-pci" || len(obs.Holders) != 0 {
		t.Fatalf("observe attached: %+v %v", obs, err)
	}
	// A second Prepare on an already-bound device only checks the group node.
	if _, err := v.Prepare(context.Background(), &d, "sb1"); err != nil {
		t.Fatalf("prepare when already vfio-pci: %v", err)
	}

	if err := v.Release(context.Background(), &d); err != nil {
		t.Fatal(err)
	}
	if got := driverOf(h, h100.Addr); got != "nvidia" {
		t.Fatalf("driver after release: %q", got)
	}
	if readFile(t, override) != "" {
		t.Fatalf("driver_override not cleared: %q", readFile(t, override))
	}
	if _, err := os.Stat(filepath.Join(h.Dev, "vfio/12")); !os.IsNotExist(err) {
		t.Fatalf("group node survived unbind: %v", err)
	}
	// Released and back on the host driver: nothing left to undo.
	if err := v.Release(context.Background(), &d); err != nil {
		t.Fatalf("second release: %v", err)
	}
}

// Without --accel-vfio-rebind the backend never writes to sysfs.
func TestVFIORefusesRebindWhenDisabled(t *testing.T) {
	h := acceltest.NewHost(t, h100)
	d := discoverOne(t, h, h100.Addr)
	writes := 0
	cfg := h.VFIOConfig(false)
	cfg.AfterWrite = func(string, string) { writes++ }
	v := accel.NewVFIO(cfg)
	if _, err := v.Prepare(context.Background(), &d, "sb1"); err == nil || errors.Is(err, accel.ErrUncertain) {
		t.Fatalf("prepare without rebind: %v", err)
	}
	if writes != 0 || driverOf(h, h100.Addr) != "nvidia" {
		t.Fatalf("tree touched: %d writes, driver %q", writes, driverOf(h, h100.Addr))
	}
	override := filepath.Join(h.Sysfs, "bus/pci/devices", h100.Addr, "driver_override")
	if readFile(t, override) != "" {
		t.Fatal("driver_override written")
	}
}

// A write that fails after the device left its driver is uncertain: the
// manager must quarantine, not return the device.
func TestVFIOPrepareHalfWayIsUncertain(t *testing.T) {
	h := acceltest.NewHost(t, h100)
	d := discoverOne(t, h, h100.Addr)
	probe := filepath.Join(h.Sysfs, "bus/pci/drivers_probe")
	if err := os.Remove(probe); err != nil { // O_CREATE is never used, so the write fails
		t.Fatal(err)
	}
	v := accel.NewVFIO(h.VFIOConfig(true))
	if _, err := v.Prepare(context.Background(), &d, "sb1"); !errors.Is(err, accel.ErrUncertain) {
		t.Fatalf("half-way prepare: %v", err)
	}
	if got := driverOf(h, h100.Addr); got != "" {
		t.Fatalf("device should be unbound mid-way, has %q", got)
	}
}

func TestVFIOValidate(t *testing.T) {
	audio := acceltest.GPU{Addr: "0000:3b:00.1", VendorID: "0x10de", DeviceID: "0x22ba", Class: "0x040300", IOMMUGroup: 12, Driver: "snd_hda_intel"}
	bridge := acceltest.GPU{Addr: "0000:3a:00.0", VendorID: "0x8086", DeviceID: "0x2030", Class: "0x060400", IOMMUGroup: 12, Driver: "pcieport"}
	nic := acceltest.GPU{Addr: "0000:3c:00.0", VendorID: "0x8086", DeviceID: "0x1572", Class: "0x020000", IOMMUGroup: 12, Driver: "i40e"}

	t.Run("viable group with bridge and same-slot sibling", func(t *testing.T) {
		h := acceltest.NewHost(t, h100, audio, bridge)
		d := discoverOne(t, h, h100.Addr)
		if err := accel.NewVFIO(h.VFIOConfig(false)).Validate(&d); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("group member bound to a host driver", func(t *testing.T) {
		h := acceltest.NewHost(t, h100, nic)
		d := discoverOne(t, h, h100.Addr)
		err := accel.NewVFIO(h.VFIOConfig(false)).Validate(&d)
		if err == nil || !strings.Contains(err.Error(), "0000:3c:00.0") {
			t.Fatalf("non-viable group: %v", err)
		}
	})
	t.Run("member already on vfio-pci is fine", func(t *testing.T) {
		nic := nic
		nic.Driver = "vfio-pci"
		h := acceltest.NewHost(t, h100, nic)
		d := discoverOne(t, h, h100.Addr)
		if err := accel.NewVFIO(h.VFIOConfig(false)).Validate(&d); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("IOMMU off", func(t *testing.T) {
		h := acceltest.NewHost(t, h100)
		d := discoverOne(t, h, h100.Addr)
		if err := os.RemoveAll(filepath.Join(h.Sysfs, "kernel/iommu_groups")); err != nil {
			t.Fatal(err)
		}
		if err := accel.NewVFIO(h.VFIOConfig(false)).Validate(&d); err == nil || !strings.Contains(err.Error(), "IOMMU") {
			t.Fatalf("iommu off: %v", err)
		}
	})
	t.Run("vfio-pci module missing", func(t *testing.T) {
		h := acceltest.NewHost(t, h100)
		d := discoverOne(t, h, h100.Addr)
		if err := os.RemoveAll(filepath.Join(h.Sysfs, "module/vfio_pci")); err != nil {
			t.Fatal(err)
		}
		if err := accel.NewVFIO(h.VFIOConfig(false)).Validate(&d); err == nil || !strings.Contains(err.Error(), "vfio-pci") {
			t.Fatalf("no module: %v", err)
		}
	})
}

// A process holding the group node (the VMM) blocks release.
func TestVFIOReleaseBlockedByHolder(t *testing.T) {
	h := acceltest.NewHost(t, h100)
	d := discoverOne(t, h, h100.Addr)
	v := accel.NewVFIO(h.VFIOConfig(true))
	if err := v.Validate(&d); err != nil {
		t.Fatal(err)
	}
	if _, err := v.Prepare(context.Background(), &d, "sb1"); err != nil {
		t.Fatal(err)
	}
	// The emulated group node is 242:12, which no driver here opens; a
	// VMM's fd is stood in for by /dev/full's numbers (1:7) at that path.
	group := filepath.Join(h.Dev, "vfio/12")
	mknodFull(t, group)
	stop := holdNode(t, group)
	err := v.Release(context.Background(), &d)
	if !errors.Is(err, accel.ErrBusy) {
		t.Fatalf("release with holder: %v", err)
	}
	if driverOf(h, h100.Addr) != "vfio-pci" {
		t.Fatal("device moved while held")
	}
	stop()
	if err := v.Release(context.Background(), &d); err != nil {
		t.Fatal(err)
	}
	if driverOf(h, h100.Addr) != "nvidia" {
		t.Fatal("not returned to nvidia")
	}
}

// mknodFull makes path a character device 1:7 (what /dev/full is), which
// opens everywhere without hardware.
func mknodFull(t *testing.T, path string) {
	t.Helper()
	os.Remove(path)
	if err := unix.Mknod(path, unix.S_IFCHR|0o666, int(unix.Mkdev(1, 7))); err != nil {
		t.Fatal(err)
	}
}

// holdNode starts `sleep` with node open as fd 3; stop kills and reaps it.
func holdNode(t *testing.T, node string) (stop func()) {
	t.Helper()
	f, err := os.OpenFile(node, os.O_RDWR, 0)
	if err != nil {
		t.Fatalf("open %s: %v", node, err)
	}
	cmd := exec.Command("sleep", "30")
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatal(err)
	}
	f.Close() // only the child holds it now
	done := false
	stop = func() {
		if !done {
			done = true
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}
	t.Cleanup(stop)
	return stop
}
