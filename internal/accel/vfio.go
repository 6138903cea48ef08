package accel

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// VFIOConfig points the VFIO backend at host trees.
type VFIOConfig struct {
	SysfsRoot string // default "/sys"
	DevRoot   string // default "/dev"
	ProcRoot  string // default "/proc"
	// AllowRebind permits unbinding the host driver and binding vfio-pci
	// (--accel-vfio-rebind). Without it the backend never writes to sysfs.
	AllowRebind bool
	// AfterWrite, when set, runs after every sysfs write. Tests use it to
	// emulate the kernel's reaction on a fake tree.
	AfterWrite func(path, value string)
}

// HostDriverLabel records the driver a device had before it was handed to
// vfio-pci. Validate sets it; the manager persists Labels, so Release and a
// restarted node still know what to bind back.
const HostDriverLabel = "host-driver"

const driverVFIO = "vfio-pci"

// VFIO binds a PCI function to vfio-pci and hands its IOMMU group to a VMM.
type VFIO struct{ cfg VFIOConfig }

var _ Backend = (*VFIO)(nil)

// NewVFIO returns a VFIO backend.
func NewVFIO(cfg VFIOConfig) *VFIO {
	hostRoots(&cfg.SysfsRoot, &cfg.DevRoot, &cfg.ProcRoot)
	return &VFIO{cfg: cfg}
}

// Type implements Backend.
func (v *VFIO) Type() BackendType { return BackendVFIO }

func (v *VFIO) sysDir(dev *Device) string {
	return filepath.Join(v.cfg.SysfsRoot, "bus", "pci", "devices", dev.PCIAddress)
}

func (v *VFIO) groupNode(dev *Device) string {
	return filepath.Join(v.cfg.DevRoot, "vfio", dev.IOMMUGroup)
}

// Validate implements Backend: IOMMU on, vfio-pci loaded, and the device's
// IOMMU group viable (nothing else in it that the host is using). It also
// records the host driver in Labels[HostDriverLabel].
func (v *VFIO) Validate(dev *Device) error {
	groups, err := os.ReadDir(filepath.Join(v.cfg.SysfsRoot, "kernel", "iommu_groups"))
	if err != nil || len(groups) == 0 {
		return errors.New("IOMMU disabled (no iommu groups; boot with intel_iommu=on/amd_iommu=on)")
	}
	if _, err := os.Stat(filepath.Join(v.cfg.SysfsRoot, "module", "vfio_pci")); err != nil {
		return errors.New("vfio-pci module not loaded")
	}
	if dev.IOMMUGroup == "" {
		return fmt.Errorf("device %s has no iommu group", dev.PCIAddress)
	}
	gdir := filepath.Join(v.cfg.SysfsRoot, "kernel", "iommu_groups", dev.IOMMUGroup, "devices")
	members, err := os.ReadDir(gdir)
	if err != nil {
		return fmt.Errorf("iommu group %s: %w", dev.IOMMUGroup, err)
	}
	for _, m := range members {
		other := m.Name()
		if other == dev.PCIAddress || sameSlot(other, dev.PCIAddress) {
			continue
		}
		odir := filepath.Join(gdir, other)
		if strings.HasPrefix(strings.TrimPrefix(readTrim(filepath.Join(odir, "class")), "0x"), "0604") {
			continue // PCI bridge: never assigned, harmless
		}
		switch drv := linkBase(filepath.Join(odir, "driver")); drv {
		case "", driverVFIO, "pci-stub":
		default:
			return fmt.Errorf("iommu group %s not viable: %s is bound to %s", dev.IOMMUGroup, other, drv)
		}
	}
	if drv := linkBase(filepath.Join(v.sysDir(dev), "driver")); drv != "" && drv != driverVFIO {
		if dev.Labels == nil {
			dev.Labels = map[string]string{}
		}
		dev.Labels[HostDriverLabel] = drv
	}
	return nil
}

// sameSlot: two functions of one PCI slot (0000:3b:00.0 and 0000:3b:00.1).
func sameSlot(a, b string) bool {
	ia, ib := strings.LastIndexByte(a, '.'), strings.LastIndexByte(b, '.')
	return ia > 0 && ib > 0 && a[:ia] == b[:ib]
}

// write is one sysfs write followed by the AfterWrite hook. O_CREATE is
// not used: every file written exists in real sysfs, and a missing one
// means the tree is not what we think.
func (v *VFIO) write(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(value)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if v.cfg.AfterWrite != nil {
		v.cfg.AfterWrite(path, value)
	}
	return err
}

func errRebindDisabled() error { return errors.New("rebinding disabled (--accel-vfio-rebind)") }

// Prepare implements Backend: rebind to vfio-pci via driver_override,
// unbind, drivers_probe. Any failure after the first write wraps
// ErrUncertain, since the device may be half-way between drivers.
func (v *VFIO) Prepare(ctx context.Context, dev *Device, sandboxID string) (Attachment, error) {
	if dev.IOMMUGroup == "" {
		return Attachment{}, fmt.Errorf("device %s has no iommu group", dev.PCIAddress)
	}
	dir := v.sysDir(dev)
	cur := linkBase(filepath.Join(dir, "driver"))
	if cur != driverVFIO {
		if !v.cfg.AllowRebind {
			return Attachment{}, errRebindDisabled()
		}
		if cur != "" && (dev.Labels == nil || dev.Labels[HostDriverLabel] == "") {
			if dev.Labels == nil {
				dev.Labels = map[string]string{}
			}
			dev.Labels[HostDriverLabel] = cur
		}
		if err := v.write(filepath.Join(dir, "driver_override"), driverVFIO); err != nil {
			// The first write failed: the binding is untouched.
			return Attachment{}, fmt.Errorf("set driver_override: %w", err)
		}
		uncertain := func(step string, err error) (Attachment, error) {
			return Attachment{}, fmt.Errorf("%w: vfio prepare %s: %s: %v", ErrUncertain, dev.PCIAddress, step, err)
		}
		if cur != "" {
			if err := v.write(filepath.Join(dir, "driver", "unbind"), dev.PCIAddress); err != nil {
				return uncertain("unbind "+cur, err)
			}
		}
		if err := v.write(filepath.Join(v.cfg.SysfsRoot, "bus", "pci", "drivers_probe"), dev.PCIAddress); err != nil {
			return uncertain("drivers_probe", err)
		}
		if got := linkBase(filepath.Join(dir, "driver")); got != driverVFIO {
			return uncertain("verify", fmt.Errorf("driver is %q, want vfio-pci", got))
		}
		if err := v.checkGroupNode(dev); err != nil {
			return uncertain("verify", err)
		}
	} else if err := v.checkGroupNode(dev); err != nil {
		return Attachment{}, err
	}
	return Attachment{
		VFIOGroups: []string{"/dev/vfio/" + dev.IOMMUGroup},
		Env:        map[string]string{"CUBICLE_ACCELERATORS": dev.ID},
	}, nil
}

func (v *VFIO) checkGroupNode(dev *Device) error {
	if _, err := nodeAt(v.groupNode(dev), "/dev/vfio/"+dev.IOMMUGroup); err != nil {
		return fmt.Errorf("vfio group node: %w", err)
	}
	return nil
}

func (v *VFIO) holders(dev *Device) ([]int, error) {
	n, err := nodeAt(v.groupNode(dev), "/dev/vfio/"+dev.IOMMUGroup)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil // no group node: nobody can hold it
		}
		return nil, err
	}
	return Holders(v.cfg.ProcRoot, []DeviceNode{n})
}

// Release implements Backend: refuse while a process (the VMM) holds the
// group, then unbind vfio-pci, clear driver_override and reprobe so the
// original driver takes the device back.
func (v *VFIO) Release(ctx context.Context, dev *Device) error {
	h, err := v.holders(dev)
	if err != nil {
		return fmt.Errorf("vfio release %s: holders: %w", dev.PCIAddress, err)
	}
	if len(h) > 0 {
		return fmt.Errorf("%w: /dev/vfio/%s held by pids %v", ErrBusy, dev.IOMMUGroup, h)
	}
	want := v.ExpectedDriver(dev)
	dir := v.sysDir(dev)
	cur := linkBase(filepath.Join(dir, "driver"))
	override := readTrim(filepath.Join(dir, "driver_override"))
	if override == "(null)" {
		override = ""
	}
	if cur == want && (override == "" || want == driverVFIO) {
		return nil // nothing to undo (never rebound, or host keeps vfio-pci)
	}
	if !v.cfg.AllowRebind {
		return errRebindDisabled()
	}
	uncertain := func(step string, err error) error {
		return fmt.Errorf("%w: vfio release %s: %s: %v", ErrUncertain, dev.PCIAddress, step, err)
	}
	if cur != "" && cur != want {
		if err := v.write(filepath.Join(dir, "driver", "unbind"), dev.PCIAddress); err != nil {
			return fmt.Errorf("unbind %s: %w", cur, err) // first write failed: unchanged
		}
	}
	if err := v.write(filepath.Join(dir, "driver_override"), "\n"); err != nil {
		return uncertain("clear driver_override", err)
	}
	if linkBase(filepath.Join(dir, "driver")) != want {
		if err := v.write(filepath.Join(v.cfg.SysfsRoot, "bus", "pci", "drivers_probe"), dev.PCIAddress); err != nil {
			return uncertain("drivers_probe", err)
		}
	}
	if got := linkBase(filepath.Join(dir, "driver")); got != want {
		return uncertain("verify", fmt.Errorf("driver is %q, want %q", got, want))
	}
	return nil
}

// Observe implements Backend; holders are counted on the group node, which
// is what a VMM keeps open.
func (v *VFIO) Observe(dev *Device) (Observation, error) {
	obs, err := observePCI(v.sysDir(dev))
	if err != nil || !obs.Present {
		return obs, err
	}
	if dev.IOMMUGroup != "" {
		h, err := v.holders(dev)
		if err != nil {
			return obs, err
		}
		obs.Holders = h
	}
	return obs, nil
}

// ExpectedDriver implements Backend: while allocatable a VFIO device sits
// on its original host driver (Labels[HostDriverLabel]), else whatever it
// had at discovery.
func (v *VFIO) ExpectedDriver(dev *Device) string {
	if d := dev.Labels[HostDriverLabel]; d != "" {
		return d
	}
	return dev.Driver
}
