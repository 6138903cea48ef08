package node

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/agentapi"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// Accelerators are a node's devices and the operator's actions on them. A
// node without accelerators (Info.Accelerators nil) has an empty inventory,
// and every device ID is accel.ErrNotFound.
type Accelerators interface {
	AcceleratorInventory(ctx context.Context) ([]accel.Device, error)
	Accelerator(ctx context.Context, id string) (accel.Device, error)
	DisableAccelerator(ctx context.Context, id, reason string) (accel.Device, error)
	EnableAccelerator(ctx context.Context, id string) (accel.Device, error)
	RecoverAccelerator(ctx context.Context, id string) (accel.Device, error)
	// DenyAccelerators records that a request for sandboxID (or a create
	// not yet a sandbox, "") was refused, and why, in the node's events.
	DenyAccelerators(ctx context.Context, sandboxID string, reason error) error
	AcceleratorEvents(ctx context.Context, limit int) ([]accel.Event, error)
}

// accelGuestTimeout bounds the in-sandbox check (nvidia-smi can take seconds
// on a cold driver).
const accelGuestTimeout = 30 * time.Second

// reserveAccelerators is the reservation stage: devices are held for id
// before anything starts, and prepared into runtime devices and mounts.
func (l *Local) reserveAccelerators(ctx context.Context, req CreateRequest) (accel.Attachment, error) {
	if l.cfg.Accel == nil {
		return accel.Attachment{}, &accel.CompatError{Stage: accel.StageReservation, Layer: accel.LayerHardware, Detail: "node " + l.cfg.ID + " has no accelerators"}
	}
	if dc, ok := l.cfg.Runtime.(runtime.DeviceCapable); !ok || !dc.SupportsDevices() {
		return accel.Attachment{}, &accel.CompatError{Stage: accel.StageReservation, Layer: accel.LayerBackend,
			Detail: "runtime " + l.cfg.Runtime.Name() + " cannot pass devices through"}
	}
	if len(req.Accelerators) != 1 {
		return accel.Attachment{}, fmt.Errorf("%w: one accelerator request per sandbox", accel.ErrInvalid)
	}
	if _, err := l.cfg.Accel.Reserve(ctx, req.ID, req.Accelerators[0], req.AccelContract); err != nil {
		return accel.Attachment{}, err
	}
	return l.cfg.Accel.Prepare(ctx, req.ID)
}

// accelSpec turns an attachment into runtime devices and read-only mounts.
func accelSpec(att accel.Attachment) ([]runtime.Device, []runtime.Mount) {
	var devs []runtime.Device
	for _, d := range att.Devices {
		devs = append(devs, runtime.Device{Path: d.Path, HostPath: d.HostPath, Type: 'c', Major: d.Major, Minor: d.Minor, FileMode: d.Mode & 0o777})
	}
	var mounts []runtime.Mount
	for _, m := range att.Mounts {
		mounts = append(mounts, runtime.Mount{Source: m, Destination: m, ReadOnly: true})
	}
	return devs, mounts
}

// checkGuest is the guest stage of the contract, run by the agent inside
// the sandbox once it is up.
func (l *Local) checkGuest(ctx context.Context, id string, addr netip.Addr, token string, att accel.Attachment, c *accel.Contract) error {
	creq := agentapi.AccelCheckRequest{Ldconfig: true, TimeoutMs: int(accelGuestTimeout / time.Millisecond)}
	for _, d := range att.Devices {
		creq.Devices = append(creq.Devices, d.Path)
	}
	dirs := map[string]bool{}
	for _, m := range att.Mounts {
		if strings.Contains(filepath.Base(m), ".so") {
			dirs[filepath.Dir(m)] = true
		}
	}
	for d := range dirs {
		creq.LibDirs = append(creq.LibDirs, d)
	}
	if c != nil && len(c.Libraries) > 0 {
		creq.Libraries = c.Libraries
	} else {
		for _, m := range att.Mounts {
			if b := filepath.Base(m); b == "libcuda.so.1" || b == "libnvidia-ml.so.1" {
				creq.Libraries = append(creq.Libraries, b)
			}
		}
	}
	switch {
	case c != nil && c.Check != "":
		creq.Check = c.Check
	default:
		for _, m := range att.Mounts {
			if filepath.Base(m) == "nvidia-smi" {
				creq.Check = m // by path: tools are mounted where the host keeps them
			}
		}
	}
	body, _ := json.Marshal(creq)
	cctx, cancel := context.WithTimeout(ctx, accelGuestTimeout+5*time.Second)
	defer cancel()
	r, _ := http.NewRequestWithContext(cctx, http.MethodPost, agentURL(id, addr, "/cubicle/accelerators/check"), bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	r.Header.Set("X-Access-Token", token)
	resp, err := l.client.Do(r)
	if err != nil {
		return fmt.Errorf("accelerator guest check: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("accelerator guest check: status %d: %s", resp.StatusCode, b)
	}
	var out agentapi.AccelCheckResponse
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&out); err != nil {
		return fmt.Errorf("accelerator guest check: %w", err)
	}
	if out.OK {
		return nil
	}
	var details []string
	for _, f := range out.Failures {
		details = append(details, f.Detail)
	}
	return &accel.CompatError{Stage: accel.StageGuest, Layer: accel.Layer(out.Failures[0].Layer), Detail: strings.Join(details, "; ")}
}

// releaseAccelerators runs once the runtime has deleted the sandbox.
func (l *Local) releaseAccelerators(ctx context.Context, id string) error {
	if l.cfg.Accel == nil {
		return nil
	}
	return l.cfg.Accel.Release(ctx, id)
}

// errNoAccelerators is every device lookup on a node without any.
func errNoAccelerators(id string) error {
	return fmt.Errorf("%w: %s (the node has no accelerators)", accel.ErrNotFound, id)
}

// AcceleratorInventory implements Node.
func (l *Local) AcceleratorInventory(context.Context) ([]accel.Device, error) {
	if l.cfg.Accel == nil {
		return nil, nil
	}
	return l.cfg.Accel.Inventory(), nil
}

// Accelerator implements Node.
func (l *Local) Accelerator(_ context.Context, id string) (accel.Device, error) {
	if l.cfg.Accel == nil {
		return accel.Device{}, errNoAccelerators(id)
	}
	return l.cfg.Accel.Get(id)
}

// DisableAccelerator implements Node.
func (l *Local) DisableAccelerator(_ context.Context, id, reason string) (accel.Device, error) {
	if l.cfg.Accel == nil {
		return accel.Device{}, errNoAccelerators(id)
	}
	return l.cfg.Accel.Disable(id, reason)
}

// EnableAccelerator implements Node.
func (l *Local) EnableAccelerator(_ context.Context, id string) (accel.Device, error) {
	if l.cfg.Accel == nil {
		return accel.Device{}, errNoAccelerators(id)
	}
	return l.cfg.Accel.Enable(id)
}

// RecoverAccelerator implements Node.
func (l *Local) RecoverAccelerator(_ context.Context, id string) (accel.Device, error) {
	if l.cfg.Accel == nil {
		return accel.Device{}, errNoAccelerators(id)
	}
	return l.cfg.Accel.Recover(id)
}

// DenyAccelerators implements Node; a node without accelerators keeps no
// events.
func (l *Local) DenyAccelerators(_ context.Context, sandboxID string, reason error) error {
	if l.cfg.Accel != nil {
		l.cfg.Accel.Deny(sandboxID, reason)
	}
	return nil
}

// AcceleratorEvents implements Node.
func (l *Local) AcceleratorEvents(_ context.Context, limit int) ([]accel.Event, error) {
	if l.cfg.Accel == nil {
		return nil, nil
	}
	return l.cfg.Accel.Events(limit), nil
}

// StartAccelerators reconciles persisted device records against the host
// and the live sandboxes before any capacity is advertised.
func (l *Local) StartAccelerators(ctx context.Context) error {
	if l.cfg.Accel == nil {
		return nil
	}
	return l.cfg.Accel.Start(ctx, l.sandboxLive(ctx))
}

// ReconcileAccelerators is the periodic repair loop's body.
func (l *Local) ReconcileAccelerators(ctx context.Context) {
	if l.cfg.Accel != nil {
		l.cfg.Accel.Reconcile(ctx, l.sandboxLive(ctx))
	}
}

// sandboxLive answers from the runtime: a sandbox is live while the runtime
// still has it running or paused.
func (l *Local) sandboxLive(ctx context.Context) func(string) bool {
	infos, err := l.cfg.Runtime.List(ctx)
	live := map[string]bool{}
	for _, in := range infos {
		if in.State == runtime.StateRunning || in.State == runtime.StatePaused {
			live[in.ID] = true
		}
	}
	return func(id string) bool {
		if err != nil {
			return true // unknown: never release on a failed listing
		}
		if live[id] {
			return true
		}
		// A create in flight holds devices before its runtime process exists.
		l.mu.Lock()
		defer l.mu.Unlock()
		return l.creating[id]
	}
}
