// Package accel is Cubicle's backend-agnostic accelerator model: what a
// device is, what a sandbox asks for, what a template promises it is
// compatible with, the device state machine and the node-local manager that
// owns reservation, release and reconciliation. Backends (device-node
// passthrough for OCI runtimes, VFIO for microVMs) plug in underneath.
package accel

import (
	"context"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

// Class is the kind of accelerator.
type Class string

const (
	ClassGPU   Class = "gpu"
	ClassTPU   Class = "tpu"
	ClassXPU   Class = "xpu"
	ClassOther Class = "other"
)

// ValidClass reports whether c is one of the known classes.
func ValidClass(c Class) bool {
	switch c {
	case ClassGPU, ClassTPU, ClassXPU, ClassOther:
		return true
	}
	return false
}

// BackendType names how a device reaches a sandbox.
type BackendType string

const (
	// BackendPassthrough bind-mounts device nodes, driver libraries and tools
	// into an OCI container (NVIDIA-container-toolkit style).
	BackendPassthrough BackendType = "passthrough"
	// BackendVFIO binds the PCI function to vfio-pci and hands its IOMMU
	// group to a VMM (microVM runtimes).
	BackendVFIO BackendType = "vfio"
)

// AllocationMode is how a device is shared; only exclusive exists today.
type AllocationMode string

const AllocExclusive AllocationMode = "exclusive"

// Health is the health summary shown to schedulers and operators.
type Health string

const (
	HealthHealthy   Health = "healthy"
	HealthUnhealthy Health = "unhealthy"
	HealthUnknown   Health = "unknown"
)

// DeviceNode is a character device a backend exposes to a sandbox.
type DeviceNode struct {
	Path     string `json:"path"`     // path inside the sandbox (and on the host, under the dev root)
	HostPath string `json:"hostPath"` // path on the host
	Major    int64  `json:"major"`
	Minor    int64  `json:"minor"`
	Mode     uint32 `json:"mode"` // permission bits
}

// Device is one accelerator in a node's inventory.
type Device struct {
	ID         string            `json:"id"` // stable: "<class>-<pci address>", e.g. gpu-0000:3b:00.0
	Class      Class             `json:"class"`
	Vendor     string            `json:"vendor"`   // human name: nvidia, amd, intel, or the hex id
	VendorID   string            `json:"vendorID"` // 0x10de
	DeviceID   string            `json:"deviceID"` // 0x2330
	Model      string            `json:"model,omitempty"`
	MemoryMB   int64             `json:"memoryMB,omitempty"`
	Labels     map[string]string `json:"labels,omitempty"`
	Allocation AllocationMode    `json:"allocation"`
	Backend    BackendType       `json:"backend"`
	Health     Health            `json:"health"`
	NUMANode   int               `json:"numaNode"` // -1 when unknown
	PCIAddress string            `json:"pciAddress"`
	IOMMUGroup string            `json:"iommuGroup,omitempty"`
	Driver     string            `json:"driver,omitempty"` // bound kernel driver ("" = none)
	// DriverVersion and CUDAVersion come from nvidia-smi when present.
	DriverVersion string `json:"driverVersion,omitempty"`
	CUDAVersion   string `json:"cudaVersion,omitempty"`
	UUID          string `json:"uuid,omitempty"`
	Minor         int    `json:"minor"` // vendor device minor (/dev/nvidiaN); -1 when none

	State  State  `json:"state"`
	Reason string `json:"reason,omitempty"` // why unhealthy/quarantined/disabled
	// SandboxID holds the device while reserved..releasing.
	SandboxID string    `json:"sandboxID,omitempty"`
	Since     time.Time `json:"since"` // when State was entered
}

// Request is what a sandbox asks for (Cubicle's "accelerators" extension).
type Request struct {
	Class       Class             `json:"class"`
	Count       int               `json:"count"`
	Labels      map[string]string `json:"labels,omitempty"`
	Backend     BackendType       `json:"backend,omitempty"`
	MinMemoryMB int64             `json:"minMemoryMB,omitempty"`
	Vendor      string            `json:"vendor,omitempty"`
}

// Contract is a template's compatibility contract: what its image was built
// for. Version fields are ranges such as ">=535", ">=12.0 <13".
type Contract struct {
	Class         Class             `json:"class,omitempty"`
	Count         int               `json:"count,omitempty"` // default count for sandboxes of the template
	Labels        map[string]string `json:"labels,omitempty"`
	Backend       BackendType       `json:"backend,omitempty"`
	Vendor        string            `json:"vendor,omitempty"`
	MinMemoryMB   int64             `json:"minMemoryMB,omitempty"`
	DriverVersion string            `json:"driverVersion,omitempty"`
	CUDAVersion   string            `json:"cudaVersion,omitempty"`
	// GuestKernel and ModulesImage only mean something to VM backends.
	GuestKernel  string `json:"guestKernel,omitempty"`
	ModulesImage string `json:"modulesImage,omitempty"`
	// PinMemory asks for the sandbox memory to be fully allocated and pinned
	// before attach (VM backends; OCI sandboxes share the host's memory).
	PinMemory bool `json:"pinMemory,omitempty"`
	// Libraries the agent must find inside the sandbox (file names such as
	// libcuda.so.1); empty means the backend's defaults for the vendor.
	Libraries []string `json:"libraries,omitempty"`
	// Check is a command the agent runs inside the sandbox; it must exit 0.
	// Empty means the vendor default (nvidia-smi for NVIDIA).
	Check string `json:"check,omitempty"`
}

// Layer names where a compatibility check failed (the proposal's list).
type Layer string

const (
	LayerHardware     Layer = "hardware"      // host hardware capability mismatch
	LayerBackend      Layer = "backend"       // backend incompatibility
	LayerTemplate     Layer = "template"      // template incompatibility
	LayerGuestKernel  Layer = "guest-kernel"  // guest kernel mismatch
	LayerModulesImage Layer = "modules-image" // modules.img mismatch
	LayerDriver       Layer = "driver"        // kernel driver mismatch
	LayerRuntime      Layer = "runtime"       // user-space driver/runtime mismatch
	LayerCUDA         Layer = "cuda"          // CUDA/runtime validation failure
	LayerMemory       Layer = "memory"        // pinned memory requirement failure
)

// Stage names when a check ran.
type Stage string

const (
	StageRegistration Stage = "registration"
	StageScheduling   Stage = "scheduling"
	StageReservation  Stage = "reservation"
	StageGuest        Stage = "guest"
)

// Typed errors; callers use errors.Is / errors.As.
var (
	// ErrIncompatible: no device could ever satisfy the request (4xx, fail fast).
	ErrIncompatible = errdefs.NewReason(errdefs.ErrInvalidArgument, "accel_incompatible", "accel: incompatible")
	// ErrNoCapacity: matching devices exist but none is allocatable now.
	ErrNoCapacity = errdefs.NewReason(errdefs.ErrResourceExhausted, "accel_no_capacity", "accel: no allocatable device")
	// ErrIllegalTransition: the state machine refused a transition.
	ErrIllegalTransition = errdefs.NewReason(errdefs.ErrFailedPrecondition, "accel_illegal_transition", "accel: illegal state transition")
	ErrNotFound          = errdefs.NewReason(errdefs.ErrNotFound, "accel_device_not_found", "accel: device not found")
	// ErrBusy: a process still holds the device.
	ErrBusy = errdefs.NewReason(errdefs.ErrFailedPrecondition, "accel_device_busy", "accel: device busy")
	// ErrInvalid: a malformed request or contract.
	ErrInvalid = errdefs.NewReason(errdefs.ErrInvalidArgument, "accel_invalid", "accel: invalid")
)

// CompatError is a compatibility failure naming its layer and stage.
type CompatError struct {
	Stage  Stage
	Layer  Layer
	Device string // device id when one was involved
	Detail string
}

func (e *CompatError) Error() string {
	s := fmt.Sprintf("accelerator compatibility (%s, at %s)", e.Layer, e.Stage)
	if e.Device != "" {
		s += " on " + e.Device
	}
	return s + ": " + e.Detail
}

// Unwrap makes every CompatError an ErrIncompatible.
func (e *CompatError) Unwrap() error { return ErrIncompatible }

// Attachment is what a backend's Prepare hands to the runtime.
type Attachment struct {
	Devices []DeviceNode `json:"devices,omitempty"`
	// Mounts are read-only host files (libraries, tools) bind-mounted at the
	// same path inside the sandbox.
	Mounts []string `json:"mounts,omitempty"`
	// Env is added to the sandbox environment (NVIDIA_VISIBLE_DEVICES...).
	Env map[string]string `json:"env,omitempty"`
	// VFIOGroups are /dev/vfio/<group> paths for a VMM (VFIO backend).
	VFIOGroups []string `json:"vfioGroups,omitempty"`
}

// Observation is what a backend sees of a device on the host right now.
type Observation struct {
	Present bool
	Driver  string
	Holders []int // PIDs with an open fd on one of the device's nodes
}

// Backend is the per-type host-side implementation. The manager owns
// states; backends only touch the host.
type Backend interface {
	Type() BackendType
	// Validate checks host prerequisites for dev at node start; a non-nil
	// error marks the device unhealthy (or disabled for policy reasons)
	// with the error as reason.
	Validate(dev *Device) error
	// Prepare makes dev usable by sandboxID and returns what the runtime
	// must expose. On error the host must be as before, or the error must
	// wrap ErrUncertain.
	Prepare(ctx context.Context, dev *Device, sandboxID string) (Attachment, error)
	// Release undoes Prepare once no sandbox process is left.
	Release(ctx context.Context, dev *Device) error
	// Observe reports presence, bound driver and holders.
	Observe(dev *Device) (Observation, error)
	// ExpectedDriver is the driver a device should be bound to while
	// allocatable ("nvidia" for passthrough, the original driver for VFIO).
	ExpectedDriver(dev *Device) string
}

// ErrUncertain wraps backend failures that may have left host state changed.
var ErrUncertain = errdefs.NewReason(errdefs.ErrUnavailable, "accel_host_uncertain", "accel: host state uncertain")
