package accel

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// ManagerConfig configures the node-local accelerator owner.
type ManagerConfig struct {
	NodeID         string
	StateDir       string // <id>.json per device, events.jsonl
	Discover       func(ctx context.Context) ([]Device, error)
	Backends       map[BackendType]Backend
	DefaultBackend BackendType
	ReleaseTimeout time.Duration // holders may stay this long after release before quarantine
	Logger         *slog.Logger
	Registerer     prometheus.Registerer
}

// Manager owns every accelerator of one node: the only component that moves
// a device into or out of allocatable (the proposal's Cubelet role).
type Manager struct {
	cfg     ManagerConfig
	log     *slog.Logger
	events  *eventLog
	metrics *managerMetrics

	mu      sync.Mutex
	started bool
	devs    map[string]*Device
}

// NewManager validates the config; nothing is advertised until Start.
func NewManager(cfg ManagerConfig) (*Manager, error) {
	if cfg.StateDir == "" || cfg.Discover == nil || len(cfg.Backends) == 0 {
		return nil, errors.New("accel: StateDir, Discover and Backends are required")
	}
	if cfg.ReleaseTimeout <= 0 {
		cfg.ReleaseTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("accel: state dir: %w", err)
	}
	m := &Manager{cfg: cfg, log: cfg.Logger, events: openEventLog(cfg.StateDir), devs: map[string]*Device{}}
	m.metrics = newManagerMetrics(m, cfg.Registerer)
	return m, nil
}

func (m *Manager) backend(d *Device) (Backend, error) {
	b, ok := m.cfg.Backends[d.Backend]
	if !ok {
		return nil, &CompatError{Stage: StageReservation, Layer: LayerBackend, Device: d.ID, Detail: fmt.Sprintf("backend %q is not configured on this node", d.Backend)}
	}
	return b, nil
}

func (m *Manager) recordPath(id string) string { return filepath.Join(m.cfg.StateDir, id+".json") }

// persist writes d's record durably (tmp + fsync + rename).
func (m *Manager) persist(d *Device) error {
	b, err := json.MarshalIndent(d, "", "  ")
	if err != nil {
		return err
	}
	tmp := m.recordPath(d.ID) + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err = f.Write(b); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return os.Rename(tmp, m.recordPath(d.ID))
}

func (m *Manager) event(typ string, d *Device, sandbox, from, to, reason string) {
	e := Event{Time: time.Now().UTC(), Type: typ, Sandbox: sandbox, From: from, To: to, Reason: reason}
	if d != nil {
		e.Device = d.ID
	}
	if err := m.events.append(e); err != nil {
		m.log.Warn("accelerator event log", "err", err)
	}
	m.metrics.event(typ)
	m.log.Info("accelerator "+typ, "device", e.Device, "sandbox", sandbox, "from", from, "to", to, "reason", reason)
}

var eventOf = map[State]string{
	StateAllocatable: "allocatable", StateReserved: "reserve", StatePreparing: "prepare", StateAttached: "attach",
	StateReleasing: "release", StateReleased: "released", StateUnhealthy: "unhealthy", StateQuarantined: "quarantine",
	StateDisabled: "disable", StateInitialized: "enable",
}

// transition is the only place a device's State changes.
func (m *Manager) transition(d *Device, to State, owner Owner, reason string) error {
	if err := CheckTransition(d.State, to, owner); err != nil {
		return err
	}
	from := d.State
	sandbox := d.SandboxID
	d.State, d.Since, d.Reason = to, time.Now().UTC(), reason
	switch to {
	case StateAllocatable, StateInitialized:
		d.SandboxID, d.Reason = "", ""
	case StateUnhealthy, StateQuarantined, StateDisabled, StateReleased:
		d.SandboxID = "" // the event above keeps who had it
	}
	if d.Health == "" || to == StateAllocatable {
		d.Health = HealthHealthy
	}
	if to == StateUnhealthy {
		d.Health = HealthUnhealthy
	}
	typ := eventOf[to]
	if owner == OwnerAdmin && to == StateAllocatable {
		typ = "recover"
	}
	m.event(typ, d, sandbox, string(from), string(to), reason)
	if err := m.persist(d); err != nil {
		m.log.Error("persist accelerator", "device", d.ID, "err", err)
		return err
	}
	return nil
}

// validate is host validation: present, expected driver, no holder, backend prerequisites.
func (m *Manager) validate(d *Device) error {
	b, err := m.backend(d)
	if err != nil {
		return err
	}
	obs, err := b.Observe(d)
	if err != nil {
		return err
	}
	if !obs.Present {
		return errors.New("not present on host")
	}
	d.Driver = obs.Driver
	if want := b.ExpectedDriver(d); want != "" && obs.Driver != want {
		return fmt.Errorf("driver %q bound, want %q", obs.Driver, want)
	}
	if len(obs.Holders) > 0 {
		return fmt.Errorf("%w: held by pids %v", ErrBusy, obs.Holders)
	}
	return b.Validate(d)
}

// Start discovers devices and reconciles persisted records against the host
// and live(sandbox) before anything is advertised. Uncertain → quarantined.
func (m *Manager) Start(ctx context.Context, live func(string) bool) error {
	found, err := m.cfg.Discover(ctx)
	if err != nil {
		return fmt.Errorf("accel: discover: %w", err)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	records := map[string]*Device{}
	entries, _ := os.ReadDir(m.cfg.StateDir)
	for _, e := range entries {
		if filepath.Ext(e.Name()) != ".json" {
			continue
		}
		b, err := os.ReadFile(filepath.Join(m.cfg.StateDir, e.Name()))
		if err != nil {
			continue
		}
		var d Device
		if json.Unmarshal(b, &d) == nil && d.ID != "" {
			records[d.ID] = &d
		}
	}
	for i := range found {
		d := found[i]
		if d.Backend == "" {
			d.Backend = m.cfg.DefaultBackend
		}
		d.State, d.Since = StateInitialized, time.Now().UTC()
		rec := records[d.ID]
		delete(records, d.ID)
		if rec != nil && rec.Labels != nil {
			// Backends keep facts in labels (the VFIO host driver).
			for k, v := range rec.Labels {
				if _, ok := d.Labels[k]; !ok {
					if d.Labels == nil {
						d.Labels = map[string]string{}
					}
					d.Labels[k] = v
				}
			}
		}
		dev := &d
		m.devs[d.ID] = dev
		m.restore(dev, rec, live)
	}
	for _, rec := range records {
		// Known before, gone now: kept visible, never schedulable.
		rec.Health = HealthUnhealthy
		if rec.State.Held() {
			rec.State, rec.Reason = StateQuarantined, "not present on host while held by sandbox "+rec.SandboxID
		} else if rec.State != StateDisabled {
			rec.State, rec.Reason = StateUnhealthy, "not present on host"
		}
		m.devs[rec.ID] = rec
		m.event("restore", rec, rec.SandboxID, "", string(rec.State), rec.Reason)
		_ = m.persist(rec)
	}
	m.started = true
	return nil
}

// restore applies a persisted record to a freshly discovered device.
func (m *Manager) restore(d *Device, rec *Device, live func(string) bool) {
	vErr := m.validate(d)
	if rec == nil {
		if vErr != nil {
			_ = m.transition(d, StateUnhealthy, OwnerNode, vErr.Error())
		} else {
			_ = m.transition(d, StateAllocatable, OwnerNode, "")
		}
		return
	}
	set := func(s State, sandbox, reason string) {
		// Restoring is not a transition: the record says where it was.
		d.State, d.SandboxID, d.Reason, d.Since = s, sandbox, reason, rec.Since
		m.event("restore", d, sandbox, string(rec.State), string(s), reason)
		_ = m.persist(d)
	}
	switch {
	case rec.State == StateDisabled, rec.State == StateQuarantined, rec.State == StateUnhealthy:
		set(rec.State, "", rec.Reason)
	case rec.State.Held() || rec.State == StateReleased:
		alive := rec.SandboxID != "" && live(rec.SandboxID)
		switch {
		case alive && rec.State == StateAttached && (vErr == nil || errors.Is(vErr, ErrBusy)):
			set(StateAttached, rec.SandboxID, "")
		case alive:
			set(rec.State, rec.SandboxID, "")
			reason := "creation interrupted by a node restart"
			if vErr != nil {
				reason = "host state disagrees with the reservation: " + vErr.Error()
			}
			_ = m.transition(d, StateQuarantined, OwnerNode, reason)
		case rec.State == StatePreparing:
			set(StatePreparing, rec.SandboxID, "")
			_ = m.transition(d, StateQuarantined, OwnerNode, "node restarted while preparing; host state uncertain")
		case vErr != nil:
			set(rec.State, rec.SandboxID, "")
			_ = m.transition(d, StateQuarantined, OwnerNode, "host state disagrees with the persisted record: "+vErr.Error())
		default:
			// Proven clean: sandbox gone, device present, expected driver, no holder.
			set(StateReleased, "", "")
			_ = m.transition(d, StateAllocatable, OwnerNode, "")
		}
	default:
		if vErr != nil {
			_ = m.transition(d, StateUnhealthy, OwnerNode, vErr.Error())
		} else {
			_ = m.transition(d, StateAllocatable, OwnerNode, "")
		}
	}
}

// Inventory returns copies, sorted by ID (empty before Start).
func (m *Manager) Inventory() []Device {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Device, 0, len(m.devs))
	for _, d := range m.devs {
		out = append(out, *d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Get returns one device.
func (m *Manager) Get(id string) (Device, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.devs[id]
	if !ok {
		return Device{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return *d, nil
}

func (m *Manager) sorted() []*Device {
	out := make([]*Device, 0, len(m.devs))
	for _, d := range m.devs {
		out = append(out, d)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// fitLocked returns the allocatable matches, or why there are not enough.
func (m *Manager) fitLocked(req Request, c *Contract, stage Stage) ([]*Device, error) {
	devs := m.sorted()
	free, err := FitInventory(m.cfg.NodeID, copies(devs), req, c, stage)
	if err != nil {
		return nil, err
	}
	out := make([]*Device, len(free))
	for i, j := range free {
		out[i] = devs[j]
	}
	return out, nil
}

// Fit is the scheduling predicate on this node's inventory.
func (m *Manager) Fit(req Request, c *Contract) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.started {
		return fmt.Errorf("%w: node inventory not reconciled yet", ErrNoCapacity)
	}
	_, err := m.fitLocked(req, c, StageScheduling)
	return err
}

// Reserve atomically holds req.Count allocatable devices for sandboxID,
// preferring one NUMA node; the records are durable before it returns.
func (m *Manager) Reserve(ctx context.Context, sandboxID string, req Request, c *Contract) ([]Device, error) {
	start := time.Now()
	defer m.metrics.observe("reserve", start)
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.started {
		return nil, fmt.Errorf("%w: node inventory not reconciled yet", ErrNoCapacity)
	}
	if held := m.heldLocked(sandboxID); len(held) > 0 {
		return copies(held), nil
	}
	free, err := m.fitLocked(req, c, StageReservation)
	if err != nil {
		m.event("deny", nil, sandboxID, "", "", err.Error())
		return nil, err
	}
	count := max(req.Count, 1)
	// free is in PCI order; the first NUMA node (in that order) that can
	// hold the whole request wins, so picks are deterministic.
	byNUMA := map[int][]*Device{}
	var order []int
	for _, d := range free {
		if _, ok := byNUMA[d.NUMANode]; !ok {
			order = append(order, d.NUMANode)
		}
		byNUMA[d.NUMANode] = append(byNUMA[d.NUMANode], d)
	}
	pick := free[:count]
	for _, n := range order {
		if ds := byNUMA[n]; len(ds) >= count {
			pick = ds[:count]
			break
		}
	}
	for _, d := range pick {
		d.SandboxID = sandboxID
		if err := m.transition(d, StateReserved, OwnerNode, ""); err != nil {
			return nil, err
		}
	}
	return copies(pick), nil
}

func copies(ds []*Device) []Device {
	out := make([]Device, len(ds))
	for i, d := range ds {
		out[i] = *d
	}
	return out
}

func (m *Manager) heldLocked(sandboxID string) []*Device {
	var out []*Device
	for _, d := range m.sorted() {
		if d.SandboxID == sandboxID && sandboxID != "" && (d.State.Held() || d.State == StateReleased) {
			out = append(out, d)
		}
	}
	return out
}

// Devices lists what sandboxID holds.
func (m *Manager) Devices(sandboxID string) []Device {
	m.mu.Lock()
	defer m.mu.Unlock()
	return copies(m.heldLocked(sandboxID))
}

// Prepare runs each reserved device's backend Prepare and merges the results.
func (m *Manager) Prepare(ctx context.Context, sandboxID string) (Attachment, error) {
	defer m.metrics.observe("prepare", time.Now())
	m.mu.Lock()
	defer m.mu.Unlock()
	var att Attachment
	att.Env = map[string]string{}
	seen := map[string]bool{}
	var ids, visible []string
	for _, d := range m.heldLocked(sandboxID) {
		if d.State != StateReserved {
			continue
		}
		if err := m.transition(d, StatePreparing, OwnerNode, ""); err != nil {
			return Attachment{}, err
		}
		b, err := m.backend(d)
		var a Attachment
		if err == nil {
			a, err = b.Prepare(ctx, d, sandboxID)
		}
		if err != nil {
			if errors.Is(err, ErrUncertain) {
				_ = m.transition(d, StateQuarantined, OwnerNode, "prepare failed: "+err.Error())
			} else {
				m.releaseLocked(ctx, d, OwnerNode)
			}
			return Attachment{}, fmt.Errorf("accelerator %s: prepare: %w", d.ID, err)
		}
		for _, n := range a.Devices {
			if !seen["d:"+n.Path] {
				seen["d:"+n.Path] = true
				att.Devices = append(att.Devices, n)
			}
		}
		for _, p := range a.Mounts {
			if !seen["m:"+p] {
				seen["m:"+p] = true
				att.Mounts = append(att.Mounts, p)
			}
		}
		att.VFIOGroups = append(att.VFIOGroups, a.VFIOGroups...)
		for k, v := range a.Env {
			att.Env[k] = v
		}
		ids = append(ids, d.ID)
		if v := a.Env["NVIDIA_VISIBLE_DEVICES"]; v != "" {
			visible = append(visible, v)
		}
	}
	att.Env["CUBICLE_ACCELERATORS"] = strings.Join(ids, ",")
	if len(visible) > 0 {
		att.Env["NVIDIA_VISIBLE_DEVICES"] = strings.Join(visible, ",")
	}
	return att, nil
}

// Attached records that the runtime runs with the devices and the guest check passed.
func (m *Manager) Attached(sandboxID string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, d := range m.heldLocked(sandboxID) {
		if d.State == StatePreparing {
			if err := m.transition(d, StateAttached, OwnerRuntime, ""); err != nil {
				return err
			}
		}
	}
	return nil
}

// Release returns sandboxID's devices once no process holds them. Call it
// only after the runtime has deleted the sandbox.
func (m *Manager) Release(ctx context.Context, sandboxID string) error {
	defer m.metrics.observe("release", time.Now())
	m.mu.Lock()
	defer m.mu.Unlock()
	var errs []error
	for _, d := range m.heldLocked(sandboxID) {
		owner := OwnerNode
		if d.State == StateAttached {
			owner = OwnerRuntime // the runtime reports the teardown
		}
		if err := m.releaseLocked(ctx, d, owner); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// releaseLocked: →releasing, wait out holders (bounded), backend cleanup,
// →released, revalidate →allocatable; anything uncertain →quarantined.
func (m *Manager) releaseLocked(ctx context.Context, d *Device, owner Owner) error {
	if d.State != StateReleasing && d.State != StateReleased {
		if err := m.transition(d, StateReleasing, owner, ""); err != nil {
			return err
		}
	}
	b, err := m.backend(d)
	if err != nil {
		return m.transition(d, StateQuarantined, OwnerNode, err.Error())
	}
	if d.State == StateReleasing {
		deadline := time.Now().Add(m.cfg.ReleaseTimeout)
		for {
			obs, err := b.Observe(d)
			if err == nil && len(obs.Holders) == 0 {
				break
			}
			if time.Now().After(deadline) {
				reason := fmt.Sprintf("held by pids %v after release", obs.Holders)
				if err != nil {
					reason = "cannot observe: " + err.Error()
				}
				return m.transition(d, StateQuarantined, OwnerNode, reason)
			}
			// Wait unlocked so reservations of other devices go on; nobody
			// else moves a releasing device except another releaser, and
			// whichever finishes first wins (checked on relock).
			m.mu.Unlock()
			select {
			case <-ctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
			m.mu.Lock()
			if ctx.Err() != nil {
				return ctx.Err() // stays releasing; the reconciler retries
			}
			if d.State != StateReleasing {
				return nil // another releaser finished it
			}
		}
		if err := b.Release(ctx, d); err != nil {
			return m.transition(d, StateQuarantined, OwnerNode, "cleanup failed: "+err.Error())
		}
		if err := m.transition(d, StateReleased, OwnerNode, ""); err != nil {
			return err
		}
	}
	if err := m.validate(d); err != nil {
		return m.transition(d, StateQuarantined, OwnerNode, "revalidation after release failed: "+err.Error())
	}
	return m.transition(d, StateAllocatable, OwnerNode, "")
}

// Disable takes a free device out of allocation (ErrBusy while held).
func (m *Manager) Disable(id, reason string) (Device, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.devs[id]
	if !ok {
		return Device{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if d.State.Held() {
		return *d, fmt.Errorf("%w: %s is %s for sandbox %s", ErrBusy, id, d.State, d.SandboxID)
	}
	if d.State == StateDisabled {
		d.Reason = reason
		return *d, m.persist(d)
	}
	err := m.transition(d, StateDisabled, OwnerAdmin, reason)
	return *d, err
}

// Enable revalidates a disabled device.
func (m *Manager) Enable(id string) (Device, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.devs[id]
	if !ok {
		return Device{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if err := m.transition(d, StateInitialized, OwnerAdmin, ""); err != nil {
		return *d, err
	}
	if err := m.validate(d); err != nil {
		_ = m.transition(d, StateUnhealthy, OwnerNode, err.Error())
		return *d, fmt.Errorf("%w: %s failed validation: %v", ErrBusy, id, err)
	}
	err := m.transition(d, StateAllocatable, OwnerNode, "")
	return *d, err
}

// Recover revalidates a quarantined or unhealthy device.
func (m *Manager) Recover(id string) (Device, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.devs[id]
	if !ok {
		return Device{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	if d.State != StateQuarantined && d.State != StateUnhealthy {
		return *d, fmt.Errorf("%w: %s is %s, not quarantined or unhealthy", ErrIllegalTransition, id, d.State)
	}
	if err := m.validate(d); err != nil {
		d.Reason = "recover failed: " + err.Error()
		_ = m.persist(d)
		return *d, fmt.Errorf("%w: %s: %v", ErrBusy, id, err)
	}
	err := m.transition(d, StateAllocatable, OwnerAdmin, "")
	return *d, err
}

// Reconcile releases devices of sandboxes that are gone, retries stuck
// releases and marks drifted free devices unhealthy.
func (m *Manager) Reconcile(ctx context.Context, live func(string) bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !m.started {
		return
	}
	for _, d := range m.sorted() {
		switch {
		case d.State.Held() && !live(d.SandboxID):
			owner := OwnerNode
			if d.State == StateAttached {
				owner = OwnerRuntime
			}
			_ = m.releaseLocked(ctx, d, owner)
		case d.State == StateAllocatable:
			if err := m.validate(d); err != nil && !errors.Is(err, ErrBusy) {
				_ = m.transition(d, StateUnhealthy, OwnerNode, err.Error())
			}
		}
	}
}

// Deny records a scheduling or policy denial.
func (m *Manager) Deny(sandboxID string, err error) {
	if err != nil {
		m.event("deny", nil, sandboxID, "", "", err.Error())
	}
}

// Events returns the newest events, oldest first.
func (m *Manager) Events(limit int) []Event { return m.events.last(limit) }

type managerMetrics struct {
	dur    *prometheus.HistogramVec
	events *prometheus.CounterVec
}

func newManagerMetrics(m *Manager, reg prometheus.Registerer) *managerMetrics {
	mm := &managerMetrics{
		dur: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "cubicle_accelerator_op_duration_seconds",
			Help: "Accelerator reserve/prepare/release durations.", Buckets: prometheus.ExponentialBuckets(0.0005, 4, 10)}, []string{"op"}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "cubicle_accelerator_events_total",
			Help: "Accelerator audit events by type."}, []string{"type"}),
	}
	if reg != nil {
		reg.MustRegister(mm.dur, mm.events, inventoryCollector{m})
	}
	return mm
}

func (mm *managerMetrics) observe(op string, start time.Time) {
	mm.dur.WithLabelValues(op).Observe(time.Since(start).Seconds())
}
func (mm *managerMetrics) event(typ string) { mm.events.WithLabelValues(typ).Inc() }

var inventoryDesc = prometheus.NewDesc("cubicle_accelerators", "Accelerators by class and state.", []string{"class", "state"}, nil)

type inventoryCollector struct{ m *Manager }

func (c inventoryCollector) Describe(ch chan<- *prometheus.Desc) { ch <- inventoryDesc }
func (c inventoryCollector) Collect(ch chan<- prometheus.Metric) {
	n := map[[2]string]int{}
	for _, d := range c.m.Inventory() {
		n[[2]string{string(d.Class), string(d.State)}]++
	}
	for k, v := range n {
		ch <- prometheus.MustNewConstMetric(inventoryDesc, prometheus.GaugeValue, float64(v), k[0], k[1])
	}
}
