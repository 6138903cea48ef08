package accel

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"
)

// DiscoverConfig points discovery at host trees; tests point it at fakes.
type DiscoverConfig struct {
	SysfsRoot string // default "/sys"
	ProcRoot  string // default "/proc"
	DevRoot   string // default "/dev"
	// NvidiaSMI is the nvidia-smi path; "" looks it up in PATH. A missing
	// binary is fine: discovery then only knows what sysfs says.
	NvidiaSMI string
}

func (c DiscoverConfig) withDefaults() DiscoverConfig {
	hostRoots(&c.SysfsRoot, &c.DevRoot, &c.ProcRoot)
	return c
}

// hostRoots fills empty host tree roots with the real ones.
func hostRoots(sysfs, dev, proc *string) {
	for _, r := range []struct {
		p   *string
		def string
	}{{sysfs, "/sys"}, {dev, "/dev"}, {proc, "/proc"}} {
		if *r.p == "" {
			*r.p = r.def
		}
	}
}

const (
	vendorNVIDIA = "0x10de"
	vendorAMD    = "0x1002"
	vendorIntel  = "0x8086"
)

// VendorName maps a PCI vendor id to Cubicle's vendor name (the hex id when
// unknown).
func VendorName(id string) string {
	switch strings.ToLower(id) {
	case vendorNVIDIA:
		return "nvidia"
	case vendorAMD:
		return "amd"
	case vendorIntel:
		return "intel"
	}
	return strings.ToLower(id)
}

// pciClass maps a sysfs class ("0x030200") to an accelerator class. Only the
// base class and subclass matter: 0x0300 VGA, 0x0302 3D controller (data
// centre GPUs), 0x12 processing accelerators. TPUs/XPUs cannot be told apart
// by PCI class, so those stay "other".
func pciClass(class string) (Class, bool) {
	c := strings.ToLower(strings.TrimPrefix(strings.TrimSpace(class), "0x"))
	switch {
	case strings.HasPrefix(c, "0300"), strings.HasPrefix(c, "0302"):
		return ClassGPU, true
	case strings.HasPrefix(c, "12"):
		return ClassOther, true
	}
	return "", false
}

// Discover lists the accelerators of a host from sysfs, enriched with the
// NVIDIA proc files and nvidia-smi when present. A host without a PCI bus
// yields an empty list; an unreadable sysfs is an error.
func Discover(ctx context.Context, cfg DiscoverConfig) ([]Device, error) {
	cfg = cfg.withDefaults()
	busDir := filepath.Join(cfg.SysfsRoot, "bus", "pci", "devices")
	entries, err := os.ReadDir(busDir)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			if _, serr := os.Stat(cfg.SysfsRoot); serr != nil {
				return nil, fmt.Errorf("accel: discover: sysfs root: %w", serr)
			}
			return nil, nil // no PCI bus on this host
		}
		return nil, fmt.Errorf("accel: discover: %w", err)
	}

	var devs []Device
	for _, e := range entries {
		addr := e.Name()
		dir := filepath.Join(busDir, addr) // symlink in real sysfs; os.* follows it
		class, ok := pciClass(readTrim(filepath.Join(dir, "class")))
		if !ok {
			continue
		}
		vid := strings.ToLower(readTrim(filepath.Join(dir, "vendor")))
		d := Device{
			ID:         string(class) + "-" + addr,
			Class:      class,
			Vendor:     VendorName(vid),
			VendorID:   vid,
			DeviceID:   strings.ToLower(readTrim(filepath.Join(dir, "device"))),
			Allocation: AllocExclusive,
			Health:     HealthUnknown,
			State:      StateInitialized,
			NUMANode:   -1,
			PCIAddress: addr,
			IOMMUGroup: linkBase(filepath.Join(dir, "iommu_group")),
			Driver:     linkBase(filepath.Join(dir, "driver")),
			Minor:      -1,
			Labels:     map[string]string{},
		}
		if n, err := strconv.Atoi(readTrim(filepath.Join(dir, "numa_node"))); err == nil && n >= 0 {
			d.NUMANode = n
		}
		switch vid {
		case vendorNVIDIA:
			info := nvidiaProcInfo(cfg.ProcRoot, addr)
			if m, err := strconv.Atoi(info["Device Minor"]); err == nil {
				d.Minor = m
			}
			d.Model = info["Model"]
			d.UUID = info["GPU UUID"]
		case vendorAMD, vendorIntel:
			d.Minor = drmRenderMinor(dir)
		}
		devs = append(devs, d)
	}

	enrichNvidiaSMI(ctx, cfg.NvidiaSMI, devs)

	for i := range devs {
		setLabels(&devs[i])
	}
	sort.Slice(devs, func(i, j int) bool { return devs[i].PCIAddress < devs[j].PCIAddress })
	return devs, nil
}

func setLabels(d *Device) {
	l := d.Labels
	l["vendor"] = d.Vendor
	if d.Model != "" {
		l["model"] = strings.ReplaceAll(strings.ToLower(strings.TrimSpace(d.Model)), " ", "-")
	}
	if d.MemoryMB > 0 {
		l["memory-gb"] = strconv.FormatInt((d.MemoryMB+512)/1024, 10)
	}
	if d.Vendor == "nvidia" {
		l["cuda"] = "true"
	}
	if d.CUDAVersion != "" {
		l["cuda-version"] = d.CUDAVersion
	}
	if d.DriverVersion != "" {
		l["driver-version"] = d.DriverVersion
	}
	if d.NUMANode >= 0 {
		l["numa"] = strconv.Itoa(d.NUMANode)
	}
}

// readTrim returns a small sysfs/proc file's trimmed content, "" on error.
func readTrim(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// linkBase returns the basename of a symlink's target, "" when absent.
func linkBase(path string) string {
	t, err := os.Readlink(path)
	if err != nil {
		return ""
	}
	return filepath.Base(t)
}

// nvidiaProcInfo parses /proc/driver/nvidia/gpus/<addr>/information:
// "Key: \t value" lines such as "Device Minor: 0".
func nvidiaProcInfo(procRoot, addr string) map[string]string {
	out := map[string]string{}
	b, err := os.ReadFile(filepath.Join(procRoot, "driver", "nvidia", "gpus", addr, "information"))
	if err != nil {
		return out
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if ok {
			out[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return out
}

// drmRenderMinor finds <dev>/drm/renderD<N> and returns N (-1 when none).
func drmRenderMinor(devDir string) int {
	return drmMinor(devDir, "renderD")
}

func drmMinor(devDir, prefix string) int {
	entries, err := os.ReadDir(filepath.Join(devDir, "drm"))
	if err != nil {
		return -1
	}
	for _, e := range entries {
		if s, ok := strings.CutPrefix(e.Name(), prefix); ok {
			if n, err := strconv.Atoi(s); err == nil {
				return n
			}
		}
	}
	return -1
}

// NormalizePCIAddress turns nvidia-smi's "00000000:3B:00.0" into sysfs's
// "0000:3b:00.0": lower case, 4-digit domain.
func NormalizePCIAddress(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	parts := strings.Split(s, ":")
	if len(parts) == 3 {
		dom := strings.TrimLeft(parts[0], "0")
		if len(dom) < 4 {
			dom = strings.Repeat("0", 4-len(dom)) + dom
		}
		parts[0] = dom
		return strings.Join(parts, ":")
	}
	if len(parts) == 2 { // no domain
		return "0000:" + s
	}
	return s
}

var cudaVersionRE = regexp.MustCompile(`CUDA Version:\s*([0-9]+(?:\.[0-9]+)*)`)

// ParseCUDAVersion extracts the version from nvidia-smi's header table.
func ParseCUDAVersion(out string) string {
	if m := cudaVersionRE.FindStringSubmatch(out); m != nil {
		return m[1]
	}
	return ""
}

// SMIRow is one row of nvidia-smi --query-gpu.
type SMIRow struct {
	BusID         string // normalised sysfs form
	Name          string
	MemoryMB      int64
	DriverVersion string
	UUID          string
}

// ParseSMIQuery parses "--query-gpu=pci.bus_id,name,memory.total,
// driver_version,uuid --format=csv,noheader,nounits" output.
func ParseSMIQuery(out string) []SMIRow {
	var rows []SMIRow
	for _, line := range strings.Split(out, "\n") {
		f := strings.Split(line, ",")
		if len(f) < 5 {
			continue
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		r := SMIRow{BusID: NormalizePCIAddress(f[0]), Name: f[1], DriverVersion: f[3], UUID: f[4]}
		if n, err := strconv.ParseInt(f[2], 10, 64); err == nil {
			r.MemoryMB = n
		}
		rows = append(rows, r)
	}
	return rows
}

const smiTimeout = 10 * time.Second

// enrichNvidiaSMI fills model/memory/driver/UUID/CUDA from nvidia-smi.
// Failures are silent: the fields stay as sysfs/proc left them.
func enrichNvidiaSMI(ctx context.Context, smi string, devs []Device) {
	hasNvidia := false
	for _, d := range devs {
		if d.VendorID == vendorNVIDIA {
			hasNvidia = true
		}
	}
	if !hasNvidia {
		return
	}
	if smi == "" {
		p, err := exec.LookPath("nvidia-smi")
		if err != nil {
			return
		}
		smi = p
	}
	q, err := runSMI(ctx, smi, "--query-gpu=pci.bus_id,name,memory.total,driver_version,uuid", "--format=csv,noheader,nounits")
	if err != nil {
		return
	}
	byAddr := map[string]SMIRow{}
	for _, r := range ParseSMIQuery(q) {
		byAddr[r.BusID] = r
	}
	cuda := ""
	if out, err := runSMI(ctx, smi); err == nil {
		cuda = ParseCUDAVersion(out)
	}
	for i := range devs {
		d := &devs[i]
		if d.VendorID != vendorNVIDIA {
			continue
		}
		r, ok := byAddr[d.PCIAddress]
		if !ok {
			continue
		}
		if r.Name != "" {
			d.Model = r.Name
		}
		if r.MemoryMB > 0 {
			d.MemoryMB = r.MemoryMB
		}
		if r.DriverVersion != "" {
			d.DriverVersion = r.DriverVersion
		}
		if r.UUID != "" {
			d.UUID = r.UUID
		}
		d.CUDAVersion = cuda
	}
}

func runSMI(ctx context.Context, smi string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, smiTimeout)
	defer cancel()
	out, err := exec.CommandContext(ctx, smi, args...).Output()
	return string(out), err
}
