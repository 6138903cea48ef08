package accel

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
)

// PassthroughConfig points the passthrough backend at host trees.
type PassthroughConfig struct {
	SysfsRoot string // default "/sys"
	DevRoot   string // default "/dev"
	ProcRoot  string // default "/proc"
	// LibDirs are searched for NVIDIA user-space driver libraries.
	LibDirs []string // default /usr/lib/x86_64-linux-gnu, /usr/lib64, /usr/lib
	// BinDirs are searched for NVIDIA tools (nvidia-smi...).
	BinDirs []string // default /usr/bin, /usr/local/bin
}

// Passthrough exposes device nodes, driver libraries and tools to an OCI
// container, in the style of the NVIDIA container toolkit. It never
// changes the host: the kernel driver stays bound and the runtime does the
// bind mounts and cgroup device rules from the Attachment.
type Passthrough struct{ cfg PassthroughConfig }

var _ Backend = (*Passthrough)(nil)

// NewPassthrough returns a passthrough backend.
func NewPassthrough(cfg PassthroughConfig) *Passthrough {
	hostRoots(&cfg.SysfsRoot, &cfg.DevRoot, &cfg.ProcRoot)
	if cfg.LibDirs == nil {
		cfg.LibDirs = []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib"}
	}
	if cfg.BinDirs == nil {
		cfg.BinDirs = []string{"/usr/bin", "/usr/local/bin"}
	}
	return &Passthrough{cfg: cfg}
}

// Type implements Backend.
func (p *Passthrough) Type() BackendType { return BackendPassthrough }

// nvidiaLibGlobs are the driver libraries CUDA workloads load (the set the
// container toolkit mounts for the "utility,compute" capabilities).
var nvidiaLibGlobs = []string{
	"libnvidia-ml.so*", "libcuda.so*", "libnvidia-ptxjitcompiler.so*",
	"libnvidia-nvvm.so*", "libcudadebugger.so*", "libnvidia-cfg.so*",
	"libnvidia-gpucomp.so*", "libnvidia-allocator.so*",
}

var nvidiaBins = []string{"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control"}

// devPath is a host node under DevRoot; sandboxPath maps it to /dev.
func (p *Passthrough) devPath(rel string) string { return filepath.Join(p.cfg.DevRoot, rel) }

func sandboxDev(rel string) string { return "/dev/" + filepath.ToSlash(rel) }

// Validate implements Backend: the vendor driver must be bound and the
// nodes a sandbox needs must exist as character devices.
func (p *Passthrough) Validate(dev *Device) error {
	switch dev.Vendor {
	case "nvidia":
		if dev.Driver != "nvidia" {
			return fmt.Errorf("driver not bound: want nvidia, have %q", dev.Driver)
		}
		if dev.Minor < 0 {
			return errors.New("nvidia device minor unknown (no /proc/driver/nvidia entry)")
		}
		return p.requireNodes("nvidia"+strconv.Itoa(dev.Minor), "nvidiactl")
	case "amd":
		if dev.Minor < 0 {
			return errors.New("no DRM render node for device")
		}
		return p.requireNodes("kfd", renderNode(dev.Minor))
	case "intel":
		if dev.Minor < 0 {
			return errors.New("no DRM render node for device")
		}
		return p.requireNodes(renderNode(dev.Minor))
	}
	return fmt.Errorf("no passthrough recipe for vendor %q", dev.Vendor)
}

func renderNode(minor int) string { return filepath.Join("dri", "renderD"+strconv.Itoa(minor)) }

func (p *Passthrough) requireNodes(rels ...string) error {
	for _, rel := range rels {
		if _, err := nodeAt(p.devPath(rel), sandboxDev(rel)); err != nil {
			return fmt.Errorf("device node missing: %w", err)
		}
	}
	return nil
}

// Prepare implements Backend. It only describes what to expose; no host
// change, so an error never leaves state behind.
func (p *Passthrough) Prepare(ctx context.Context, dev *Device, sandboxID string) (Attachment, error) {
	if err := p.Validate(dev); err != nil {
		return Attachment{}, err
	}
	var a Attachment
	add := func(rel string, optional bool) error {
		n, err := nodeAt(p.devPath(rel), sandboxDev(rel))
		if err != nil {
			if optional && errors.Is(err, fs.ErrNotExist) {
				return nil
			}
			return err
		}
		a.Devices = append(a.Devices, n)
		return nil
	}
	switch dev.Vendor {
	case "nvidia":
		if err := add("nvidia"+strconv.Itoa(dev.Minor), false); err != nil {
			return Attachment{}, err
		}
		if err := add("nvidiactl", false); err != nil {
			return Attachment{}, err
		}
		for _, rel := range []string{"nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"} {
			if err := add(rel, true); err != nil {
				return Attachment{}, err
			}
		}
		// MIG/fabric capability nodes; all are needed for nvidia-smi to see caps.
		caps, _ := os.ReadDir(p.devPath("nvidia-caps"))
		for _, c := range caps {
			if err := add(filepath.Join("nvidia-caps", c.Name()), true); err != nil && !errors.Is(err, errNotCharDev) {
				return Attachment{}, err
			}
		}
		a.Mounts = append(p.nvidiaLibs(), p.nvidiaBins()...)
		id := dev.UUID
		if id == "" {
			id = strconv.Itoa(dev.Minor)
		}
		a.Env = map[string]string{"NVIDIA_VISIBLE_DEVICES": id}
	case "amd":
		if err := add("kfd", false); err != nil {
			return Attachment{}, err
		}
		if err := add(renderNode(dev.Minor), false); err != nil {
			return Attachment{}, err
		}
		if m := drmMinor(p.sysDir(dev), "card"); m >= 0 {
			if err := add(filepath.Join("dri", "card"+strconv.Itoa(m)), true); err != nil {
				return Attachment{}, err
			}
		}
		a.Env = map[string]string{}
	case "intel":
		if err := add(renderNode(dev.Minor), false); err != nil {
			return Attachment{}, err
		}
		a.Env = map[string]string{}
	}
	// CUDA_VISIBLE_DEVICES is deliberately not set: every GPU the sandbox
	// can see is one of ours. The manager merges ids across devices.
	a.Env["CUBICLE_ACCELERATORS"] = dev.ID
	return a, nil
}

func (p *Passthrough) sysDir(dev *Device) string {
	return filepath.Join(p.cfg.SysfsRoot, "bus", "pci", "devices", dev.PCIAddress)
}

// nvidiaLibs lists host driver libraries (files and their soname links),
// sorted and deduplicated; they are mounted at the same path.
func (p *Passthrough) nvidiaLibs() []string {
	seen := map[string]bool{}
	var out []string
	for _, dir := range p.cfg.LibDirs {
		for _, g := range nvidiaLibGlobs {
			m, _ := filepath.Glob(filepath.Join(dir, g))
			for _, f := range m {
				if !seen[f] {
					seen[f] = true
					out = append(out, f)
				}
			}
		}
	}
	sort.Strings(out)
	return out
}

func (p *Passthrough) nvidiaBins() []string {
	var out []string
	for _, b := range nvidiaBins {
		for _, dir := range p.cfg.BinDirs {
			f := filepath.Join(dir, b)
			if st, err := os.Stat(f); err == nil && st.Mode().IsRegular() {
				out = append(out, f)
				break // first match wins, like PATH
			}
		}
	}
	return out
}

// Release implements Backend: nothing was changed on the host.
func (p *Passthrough) Release(ctx context.Context, dev *Device) error { return nil }

// Observe implements Backend. Holders are counted on the per-device node
// only: nvidiactl and nvidia-uvm are shared by every GPU, so a holder there
// says nothing about this device.
func (p *Passthrough) Observe(dev *Device) (Observation, error) {
	obs, err := observePCI(p.sysDir(dev))
	if err != nil || !obs.Present {
		return obs, err
	}
	var rel string
	switch dev.Vendor {
	case "nvidia":
		if dev.Minor >= 0 {
			rel = "nvidia" + strconv.Itoa(dev.Minor)
		}
	case "amd", "intel":
		if dev.Minor >= 0 {
			rel = renderNode(dev.Minor)
		}
	}
	if rel != "" {
		n, err := nodeAt(p.devPath(rel), sandboxDev(rel))
		if err == nil {
			h, err := Holders(p.cfg.ProcRoot, []DeviceNode{n})
			if err != nil {
				return obs, err
			}
			obs.Holders = h
		}
	}
	return obs, nil
}

// ExpectedDriver implements Backend.
func (p *Passthrough) ExpectedDriver(dev *Device) string {
	switch dev.Vendor {
	case "nvidia":
		return "nvidia"
	case "amd":
		return "amdgpu"
	case "intel":
		return "i915"
	}
	return dev.Driver
}
