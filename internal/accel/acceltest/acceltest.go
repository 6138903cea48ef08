// Package acceltest builds fake accelerator hosts for tests: a sysfs tree
// laid out like the kernel's (bus/pci/devices symlinks into devices/,
// iommu_group and driver links), mknod'ed device nodes, the NVIDIA proc
// files, a fake nvidia-smi and driver libraries. Only hardware is faked.
package acceltest

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// GPU describes one fake PCI function.
type GPU struct {
	Addr, VendorID, DeviceID, Class string
	NUMA, IOMMUGroup                int
	Driver                          string // "nvidia", "vfio-pci", "" (unbound)
	Minor                           int    // nvidia: /dev/nvidiaN; amd: DRM render minor (128+)
	Model                           string
	MemoryMB                        int
	UUID                            string
}

// Host is a fake host tree.
type Host struct {
	Root, Sysfs, Dev, Proc, Bin, Lib string
	GPUs                             []GPU
	t                                testing.TB
}

// Skip skips tests that need root (mknod); under CI=true it fails them.
func Skip(t testing.TB) {
	t.Helper()
	testenv.RequireRoot(t, "fake device trees: mknod")
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func write(t testing.TB, p, s string) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	must(t, os.WriteFile(p, []byte(s), 0o644))
}

func mknod(t testing.TB, p string, major, minor uint32) {
	t.Helper()
	must(t, os.MkdirAll(filepath.Dir(p), 0o755))
	os.Remove(p)
	must(t, unix.Mknod(p, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor))))
	must(t, os.Chmod(p, 0o666))
}

// NewHost builds the tree under t.TempDir().
func NewHost(t testing.TB, gpus ...GPU) *Host {
	t.Helper()
	Skip(t)
	root := t.TempDir()
	h := &Host{Root: root, Sysfs: filepath.Join(root, "sys"), Dev: filepath.Join(root, "dev"), Proc: filepath.Join(root, "proc"),
		Bin: filepath.Join(root, "bin"), Lib: filepath.Join(root, "lib"), GPUs: gpus, t: t}
	for _, drv := range []string{"nvidia", "vfio-pci", "amdgpu"} {
		write(t, filepath.Join(h.Sysfs, "bus/pci/drivers", drv, "bind"), "")
		write(t, filepath.Join(h.Sysfs, "bus/pci/drivers", drv, "unbind"), "")
	}
	write(t, filepath.Join(h.Sysfs, "bus/pci/drivers_probe"), "")
	must(t, os.MkdirAll(filepath.Join(h.Sysfs, "module/vfio_pci"), 0o755))
	must(t, os.MkdirAll(filepath.Join(h.Sysfs, "module/nvidia"), 0o755))
	mknod(t, filepath.Join(h.Dev, "nvidiactl"), 195, 255)
	mknod(t, filepath.Join(h.Dev, "nvidia-uvm"), 235, 0)
	mknod(t, filepath.Join(h.Dev, "vfio/vfio"), 10, 196)
	var rows []string
	for _, g := range gpus {
		dir := filepath.Join(h.Sysfs, "devices/pci0000:00", g.Addr)
		write(t, filepath.Join(dir, "class"), g.Class+"\n")
		write(t, filepath.Join(dir, "vendor"), g.VendorID+"\n")
		write(t, filepath.Join(dir, "device"), g.DeviceID+"\n")
		write(t, filepath.Join(dir, "numa_node"), fmt.Sprintf("%d\n", g.NUMA))
		write(t, filepath.Join(dir, "driver_override"), "\n")
		must(t, os.MkdirAll(filepath.Join(h.Sysfs, "bus/pci/devices"), 0o755))
		must(t, os.Symlink("../../../devices/pci0000:00/"+g.Addr, filepath.Join(h.Sysfs, "bus/pci/devices", g.Addr)))
		grp := filepath.Join(h.Sysfs, "kernel/iommu_groups", fmt.Sprint(g.IOMMUGroup), "devices")
		must(t, os.MkdirAll(grp, 0o755))
		must(t, os.Symlink("../../../../devices/pci0000:00/"+g.Addr, filepath.Join(grp, g.Addr)))
		must(t, os.Symlink("../../kernel/iommu_groups/"+fmt.Sprint(g.IOMMUGroup), filepath.Join(dir, "iommu_group")))
		h.SetDriver(g.Addr, g.Driver)
		if g.VendorID == "0x10de" {
			mknod(t, filepath.Join(h.Dev, fmt.Sprintf("nvidia%d", g.Minor)), 195, uint32(g.Minor))
			write(t, filepath.Join(h.Proc, "driver/nvidia/gpus", g.Addr, "information"), fmt.Sprintf(
				"Model: \t\t %s\nIRQ:   \t\t 0\nGPU UUID: \t %s\nVideo BIOS: \t ??.??.??.??.??\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\n",
				g.Model, g.UUID, g.Addr, g.Minor))
			parts := strings.SplitN(g.Addr, ":", 2)
			rows = append(rows, fmt.Sprintf("0000%s:%s, %s, %d, 550.54.15, %s", parts[0], strings.ToUpper(parts[1]), g.Model, g.MemoryMB, g.UUID))
		}
		if g.VendorID == "0x1002" {
			// amdgpu: <dev>/drm/{cardN,renderD(128+N)} and the shared /dev/kfd.
			// Minor is the render minor, as for Device.Minor.
			card := g.Minor - 128
			must(t, os.MkdirAll(filepath.Join(dir, "drm", fmt.Sprintf("card%d", card)), 0o755))
			must(t, os.MkdirAll(filepath.Join(dir, "drm", fmt.Sprintf("renderD%d", g.Minor)), 0o755))
			mknod(t, filepath.Join(h.Dev, "kfd"), 234, 0)
			mknod(t, filepath.Join(h.Dev, "dri", fmt.Sprintf("renderD%d", g.Minor)), 226, uint32(g.Minor))
			mknod(t, filepath.Join(h.Dev, "dri", fmt.Sprintf("card%d", card)), 226, uint32(card))
		}
	}
	script := "#!/bin/sh\ncase \"$1\" in\n--query-gpu=*)\ncat <<'CSV'\n" + strings.Join(rows, "\n") + "\nCSV\n;;\n*)\n" +
		"echo '+-----------------------------------------------------------------------------------------+'\n" +
		"echo '| NVIDIA-SMI 550.54.15             Driver Version: 550.54.15      CUDA Version: 12.4     |'\n" +
		"echo '+-----------------------------------------------------------------------------------------+'\n;;\nesac\n"
	write(t, filepath.Join(h.Bin, "nvidia-smi"), script)
	must(t, os.Chmod(filepath.Join(h.Bin, "nvidia-smi"), 0o755))
	for _, lib := range []string{"libnvidia-ml.so", "libcuda.so"} {
		write(t, filepath.Join(h.Lib, lib+".550.54.15"), "\x7fELF fake\n")
		must(t, os.Symlink(lib+".550.54.15", filepath.Join(h.Lib, lib+".1")))
	}
	return h
}

func (h *Host) devDir(addr string) string { return filepath.Join(h.Sysfs, "devices/pci0000:00", addr) }

// SetDriver re-points the device's driver link ("" unbinds).
func (h *Host) SetDriver(addr, drv string) {
	link := filepath.Join(h.devDir(addr), "driver")
	os.Remove(link)
	if drv != "" {
		must(h.t, os.Symlink("../../../bus/pci/drivers/"+drv, link))
	}
}

// Remove makes the device disappear from the bus.
func (h *Host) Remove(addr string) {
	os.Remove(filepath.Join(h.Sysfs, "bus/pci/devices", addr))
	os.RemoveAll(h.devDir(addr))
}

func (h *Host) gpu(addr string) (GPU, bool) {
	for _, g := range h.GPUs {
		if g.Addr == addr {
			return g, true
		}
	}
	return GPU{}, false
}

// Kernel emulates the kernel's reaction to sysfs writes (VFIOConfig.AfterWrite).
func (h *Host) Kernel(path, value string) {
	addr := strings.TrimSpace(value)
	g, ok := h.gpu(addr)
	switch {
	case !ok:
	case filepath.Base(path) == "unbind":
		if cur, _ := os.Readlink(filepath.Join(h.devDir(addr), "driver")); filepath.Base(cur) == "vfio-pci" {
			os.Remove(filepath.Join(h.Dev, "vfio", fmt.Sprint(g.IOMMUGroup)))
		}
		h.SetDriver(addr, "")
	case filepath.Base(path) == "drivers_probe":
		b, _ := os.ReadFile(filepath.Join(h.devDir(addr), "driver_override"))
		drv := strings.TrimSpace(string(b))
		if drv == "" {
			drv = g.Driver
		}
		h.SetDriver(addr, drv)
		if drv == "vfio-pci" {
			mknod(h.t, filepath.Join(h.Dev, "vfio", fmt.Sprint(g.IOMMUGroup)), 242, uint32(g.IOMMUGroup))
		}
	}
}

// PassthroughConfig points the passthrough backend at the tree.
func (h *Host) PassthroughConfig() accel.PassthroughConfig {
	return accel.PassthroughConfig{SysfsRoot: h.Sysfs, DevRoot: h.Dev, ProcRoot: "/proc", LibDirs: []string{h.Lib}, BinDirs: []string{h.Bin}}
}

// VFIOConfig points the VFIO backend at the tree with the kernel emulation.
func (h *Host) VFIOConfig(allowRebind bool) accel.VFIOConfig {
	return accel.VFIOConfig{SysfsRoot: h.Sysfs, DevRoot: h.Dev, ProcRoot: "/proc", AllowRebind: allowRebind, AfterWrite: h.Kernel}
}

// DiscoverConfig points discovery at the tree.
func (h *Host) DiscoverConfig() accel.DiscoverConfig {
	return accel.DiscoverConfig{SysfsRoot: h.Sysfs, ProcRoot: h.Proc, DevRoot: h.Dev, NvidiaSMI: filepath.Join(h.Bin, "nvidia-smi")}
}
