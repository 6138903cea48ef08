package accel

import (
	"fmt"
	"strconv"
	"strings"
)

// MaxCount is the most devices one request or contract may ask for.
const MaxCount = 16

func validBackend(b BackendType) bool {
	return b == "" || b == BackendPassthrough || b == BackendVFIO
}

// ValidateRequest checks a sandbox's accelerator request; errors wrap ErrInvalid.
func ValidateRequest(r Request) error {
	if !ValidClass(r.Class) {
		return fmt.Errorf("%w: unknown accelerator class %q", ErrInvalid, r.Class)
	}
	if r.Count < 1 || r.Count > MaxCount {
		return fmt.Errorf("%w: count %d out of range 1..%d", ErrInvalid, r.Count, MaxCount)
	}
	if !validBackend(r.Backend) {
		return fmt.Errorf("%w: unknown backend %q", ErrInvalid, r.Backend)
	}
	for k := range r.Labels {
		if k == "" || len(k) > 63 {
			return fmt.Errorf("%w: label key %q must be 1..63 characters", ErrInvalid, k)
		}
	}
	if r.MinMemoryMB < 0 {
		return fmt.Errorf("%w: minMemoryMB %d is negative", ErrInvalid, r.MinMemoryMB)
	}
	return nil
}

func regErr(l Layer, format string, a ...any) *CompatError {
	return &CompatError{Stage: StageRegistration, Layer: l, Detail: fmt.Sprintf(format, a...)}
}

// ValidateContract checks a template contract at registration. Problems are
// *CompatError with Stage registration (errors.Is(err, ErrIncompatible)).
func ValidateContract(c Contract) error {
	if c.Class != "" && !ValidClass(c.Class) {
		return regErr(LayerTemplate, "unknown accelerator class %q", c.Class)
	}
	if c.Count < 0 || c.Count > MaxCount {
		return regErr(LayerTemplate, "count %d out of range 0..%d", c.Count, MaxCount)
	}
	if !validBackend(c.Backend) {
		return regErr(LayerBackend, "unknown backend %q", c.Backend)
	}
	for k := range c.Labels {
		if k == "" || len(k) > 63 {
			return regErr(LayerTemplate, "label key %q must be 1..63 characters", k)
		}
	}
	if c.MinMemoryMB < 0 {
		return regErr(LayerTemplate, "minMemoryMB %d is negative", c.MinMemoryMB)
	}
	if _, err := ParseRange(c.DriverVersion); err != nil {
		return regErr(LayerDriver, "driverVersion: %v", err)
	}
	if _, err := ParseRange(c.CUDAVersion); err != nil {
		return regErr(LayerCUDA, "cudaVersion: %v", err)
	}
	if c.Backend != BackendVFIO {
		if c.GuestKernel != "" {
			return regErr(LayerGuestKernel, "guestKernel requires backend vfio, not %q", c.Backend)
		}
		if c.ModulesImage != "" {
			return regErr(LayerModulesImage, "modulesImage requires backend vfio, not %q", c.Backend)
		}
		if c.PinMemory {
			return regErr(LayerMemory, "pinMemory requires backend vfio, not %q", c.Backend)
		}
	}
	return nil
}

// Version is a dotted numeric version.
type Version []int

// ParseVersion parses "535", "12.4", "550.54.15".
func ParseVersion(s string) (Version, error) {
	if s == "" {
		return nil, fmt.Errorf("empty version")
	}
	parts := strings.Split(s, ".")
	v := make(Version, len(parts))
	for i, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || p == "" || strings.HasPrefix(p, "+") {
			return nil, fmt.Errorf("bad version %q", s)
		}
		v[i] = n
	}
	return v, nil
}

// Compare returns -1, 0, 1; missing components count as 0.
func (v Version) Compare(o Version) int {
	n := max(len(v), len(o))
	for i := 0; i < n; i++ {
		a, b := 0, 0
		if i < len(v) {
			a = v[i]
		}
		if i < len(o) {
			b = o[i]
		}
		if a < b {
			return -1
		}
		if a > b {
			return 1
		}
	}
	return 0
}

type clause struct {
	op string
	v  Version
}

// Range is a conjunction of clauses; the empty range matches anything.
type Range []clause

// ParseRange parses space-separated clauses "op version" (op one of
// >=,>,<=,<,= ; a bare version means =). "" is the empty range.
func ParseRange(s string) (Range, error) {
	var r Range
	for _, f := range strings.Fields(s) {
		op := "="
		for _, o := range []string{">=", "<=", ">", "<", "="} {
			if strings.HasPrefix(f, o) {
				op, f = o, f[len(o):]
				break
			}
		}
		v, err := ParseVersion(f)
		if err != nil {
			return nil, fmt.Errorf("range %q: %v", s, err)
		}
		r = append(r, clause{op, v})
	}
	return r, nil
}

// Contains reports whether v satisfies every clause.
func (r Range) Contains(v Version) bool {
	for _, c := range r {
		d := v.Compare(c.v)
		ok := false
		switch c.op {
		case ">=":
			ok = d >= 0
		case ">":
			ok = d > 0
		case "<=":
			ok = d <= 0
		case "<":
			ok = d < 0
		case "=":
			ok = d == 0
		}
		if !ok {
			return false
		}
	}
	return true
}

// Effective merges template contract c into sandbox request req.
func Effective(req *Request, c *Contract) (Request, error) {
	var out Request
	if req != nil {
		out = *req
		out.Labels = copyLabels(req.Labels)
	}
	if c == nil {
		if req == nil {
			return Request{}, fmt.Errorf("%w: no accelerator request", ErrInvalid)
		}
		return out, nil
	}
	se := func(format string, a ...any) error {
		return &CompatError{Stage: StageScheduling, Layer: LayerTemplate, Detail: fmt.Sprintf(format, a...)}
	}
	if req == nil {
		out.Count = c.Count
		if out.Count == 0 {
			out.Count = 1
		}
	} else if out.Count == 0 {
		out.Count = max(c.Count, 1)
	}
	switch {
	case out.Class == "":
		out.Class = c.Class
	case c.Class != "" && c.Class != out.Class:
		return Request{}, se("request class %q conflicts with template class %q", out.Class, c.Class)
	}
	switch {
	case out.Backend == "":
		out.Backend = c.Backend
	case c.Backend != "" && c.Backend != out.Backend:
		return Request{}, se("request backend %q conflicts with template backend %q", out.Backend, c.Backend)
	}
	switch {
	case out.Vendor == "":
		out.Vendor = c.Vendor
	case c.Vendor != "" && !strings.EqualFold(c.Vendor, out.Vendor):
		return Request{}, se("request vendor %q conflicts with template vendor %q", out.Vendor, c.Vendor)
	}
	for k, v := range c.Labels {
		if rv, ok := out.Labels[k]; ok && rv != v {
			return Request{}, se("label %s=%q conflicts with template %s=%q", k, rv, k, v)
		}
		if out.Labels == nil {
			out.Labels = map[string]string{}
		}
		out.Labels[k] = v
	}
	out.MinMemoryMB = max(out.MinMemoryMB, c.MinMemoryMB)
	return out, nil
}

func copyLabels(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	o := make(map[string]string, len(m))
	for k, v := range m {
		o[k] = v
	}
	return o
}

// Match returns nil when dev can serve req under contract c, else the
// failing layer.
func Match(dev Device, req Request, c *Contract, stage Stage) *CompatError {
	fail := func(l Layer, format string, a ...any) *CompatError {
		return &CompatError{Stage: stage, Layer: l, Device: dev.ID, Detail: fmt.Sprintf(format, a...)}
	}
	if req.Class != "" && dev.Class != req.Class {
		return fail(LayerHardware, "class %s, want %s", dev.Class, req.Class)
	}
	vendor := req.Vendor
	if vendor == "" && c != nil {
		vendor = c.Vendor
	}
	if vendor != "" && !strings.EqualFold(vendor, dev.Vendor) && !strings.EqualFold(vendor, dev.VendorID) {
		return fail(LayerHardware, "vendor %s, want %s", dev.Vendor, vendor)
	}
	for k, v := range req.Labels {
		if dev.Labels[k] != v {
			return fail(LayerHardware, "label %s=%q, want %q", k, dev.Labels[k], v)
		}
	}
	minMem := req.MinMemoryMB
	if c != nil {
		minMem = max(minMem, c.MinMemoryMB)
	}
	if minMem > 0 && dev.MemoryMB < minMem {
		return fail(LayerHardware, "memory %d MB, want at least %d MB", dev.MemoryMB, minMem)
	}
	backend := req.Backend
	if backend == "" && c != nil {
		backend = c.Backend
	}
	if backend != "" && dev.Backend != backend {
		return fail(LayerBackend, "backend %s, want %s", dev.Backend, backend)
	}
	if c == nil {
		return nil
	}
	if c.DriverVersion != "" {
		if e := matchVersion(c.DriverVersion, dev.DriverVersion, "driver"); e != "" {
			return fail(LayerDriver, "%s", e)
		}
	}
	if c.CUDAVersion != "" {
		if e := matchVersion(c.CUDAVersion, dev.CUDAVersion, "CUDA"); e != "" {
			return fail(LayerCUDA, "%s", e)
		}
	}
	if dev.Backend != BackendVFIO {
		if c.GuestKernel != "" {
			return fail(LayerGuestKernel, "guest kernel %q needs a vfio device, device backend is %s", c.GuestKernel, dev.Backend)
		}
		if c.ModulesImage != "" {
			return fail(LayerModulesImage, "modules image %q needs a vfio device, device backend is %s", c.ModulesImage, dev.Backend)
		}
	}
	return nil
}

func matchVersion(rng, have, what string) string {
	r, err := ParseRange(rng)
	if err != nil {
		return fmt.Sprintf("bad %s version range: %v", what, err)
	}
	if have == "" {
		return what + " version unknown"
	}
	v, err := ParseVersion(have)
	if err != nil {
		return fmt.Sprintf("%s version %q unparsable", what, have)
	}
	if !r.Contains(v) {
		return fmt.Sprintf("%s version %s outside %q", what, have, rng)
	}
	return ""
}
