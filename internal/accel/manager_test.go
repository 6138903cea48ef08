package accel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// hostBackend stands in for hardware: the test sets what the host shows.
type hostBackend struct {
	mu         sync.Mutex
	driver     map[string]string
	holders    map[string][]int
	prepareErr map[string]error
}

func (b *hostBackend) Type() BackendType      { return BackendPassthrough }
func (b *hostBackend) Validate(*Device) error { return nil }
func (b *hostBackend) Prepare(_ context.Context, d *Device, _ string) (Attachment, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.prepareErr[d.ID]; err != nil {
		return Attachment{}, err
	}
	return Attachment{Devices: []DeviceNode{{Path: "/dev/nvidia" + d.ID}}, Env: map[string]string{"NVIDIA_VISIBLE_DEVICES": d.ID}}, nil
}
func (b *hostBackend) Release(context.Context, *Device) error { return nil }
func (b *hostBackend) Observe(d *Device) (Observation, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	drv, ok := b.driver[d.ID]
	return Observation{Present: ok, Driver: drv, Holders: b.holders[d.ID]}, nil
}
func (b *hostBackend) ExpectedDriver(*Device) string { return "nvidia" }

func newTestManager(t *testing.T, dir string, b *hostBackend, ids ...string) *Manager {
	t.Helper()
	return newTestManagerReg(t, dir, b, nil, ids...)
}

func newTestManagerReg(t *testing.T, dir string, b *hostBackend, reg prometheus.Registerer, ids ...string) *Manager {
	t.Helper()
	m, err := NewManager(ManagerConfig{NodeID: "n1", StateDir: dir, Backends: map[BackendType]Backend{BackendPassthrough: b}, Registerer: reg,
		DefaultBackend: BackendPassthrough, ReleaseTimeout: 300e6,
		Discover: func(context.Context) ([]Device, error) {
			var out []Device
			for i, id := range ids {
				out = append(out, Device{ID: id, Class: ClassGPU, Vendor: "nvidia", NUMANode: i % 2})
			}
			return out, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestManagerReserveReleaseRestart(t *testing.T) {
	dir := t.TempDir()
	b := &hostBackend{driver: map[string]string{"a": "nvidia", "b": "nvidia", "c": "nvidia"}, holders: map[string][]int{}}
	m := newTestManager(t, dir, b, "a", "b", "c")
	ctx := context.Background()
	if _, err := m.Reserve(ctx, "early", Request{Class: ClassGPU, Count: 1}, nil); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("reserve before Start: %v", err)
	}
	if err := m.Start(ctx, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := map[string]string{}
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			sb := "sb" + string(rune('A'+i))
			ds, err := m.Reserve(ctx, sb, Request{Class: ClassGPU, Count: 1}, nil)
			if err == nil {
				mu.Lock()
				if prev, dup := won[ds[0].ID]; dup {
					t.Errorf("%s reserved twice (%s, %s)", ds[0].ID, prev, sb)
				}
				won[ds[0].ID] = sb
				mu.Unlock()
			} else if !errors.Is(err, ErrNoCapacity) {
				t.Errorf("reserve: %v", err)
			}
		}(i)
	}
	wg.Wait()
	if len(won) != 3 {
		t.Fatalf("winners: %v", won)
	}
	if err := m.Fit(Request{Class: ClassTPU, Count: 1}, nil); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("fit tpu: %v", err)
	}
	sbA := won["a"]
	if _, err := m.Prepare(ctx, sbA); err != nil {
		t.Fatal(err)
	}
	if err := m.Attached(sbA); err != nil {
		t.Fatal(err)
	}
	// A holder blocks the release until the timeout, then quarantines.
	b.holders["a"] = []int{4242}
	if err := m.Release(ctx, sbA); err != nil {
		t.Fatal(err)
	}
	if d, _ := m.Get("a"); d.State != StateQuarantined {
		t.Fatalf("held after release: %+v", d)
	}
	b.holders["a"] = nil
	if d, err := m.Recover("a"); err != nil || d.State != StateAllocatable {
		t.Fatalf("recover: %+v %v", d, err)
	}
	// b attached to a live sandbox, c attached to a dead one whose driver changed.
	for _, id := range []string{"b", "c"} {
		m.Prepare(ctx, won[id])
		m.Attached(won[id])
	}
	b.driver["c"] = ""
	m2 := newTestManager(t, dir, b, "a", "b", "c")
	if err := m2.Start(ctx, func(sb string) bool { return sb == won["b"] }); err != nil {
		t.Fatal(err)
	}
	want := map[string]State{"a": StateAllocatable, "b": StateAttached, "c": StateQuarantined}
	for id, st := range want {
		if d, _ := m2.Get(id); d.State != st {
			t.Fatalf("after restart %s: %+v (want %s)", id, d, st)
		}
	}
	if len(m2.Events(1000)) == 0 {
		t.Fatal("events not persisted")
	}
}

// A clean Prepare failure returns the device; an uncertain one (the host
// may be half-changed) quarantines it.
func TestManagerPrepareFailure(t *testing.T) {
	b := &hostBackend{driver: map[string]string{"a": "nvidia", "b": "nvidia"}, holders: map[string][]int{},
		prepareErr: map[string]error{"a": errors.New("node missing"), "b": fmt.Errorf("%w: unbind failed", ErrUncertain)}}
	reg := prometheus.NewRegistry()
	m := newTestManagerReg(t, t.TempDir(), b, reg, "a", "b")
	ctx := context.Background()
	if err := m.Start(ctx, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	reserve := func(sb string) string {
		ds, err := m.Reserve(ctx, sb, Request{Class: ClassGPU, Count: 1}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return ds[0].ID
	}
	if id := reserve("s1"); id != "a" {
		t.Fatalf("reserved %s, want a (first free)", id)
	}
	if id := reserve("s2"); id != "b" {
		t.Fatalf("reserved %s", id)
	}
	if _, err := m.Prepare(ctx, "s1"); err == nil || errors.Is(err, ErrUncertain) {
		t.Fatalf("clean failure: %v", err)
	}
	if d, _ := m.Get("a"); d.State != StateAllocatable || d.SandboxID != "" {
		t.Fatalf("after clean failure: %+v", d)
	}
	if _, err := m.Prepare(ctx, "s2"); !errors.Is(err, ErrUncertain) {
		t.Fatalf("uncertain failure: %v", err)
	}
	if d, _ := m.Get("b"); d.State != StateQuarantined {
		t.Fatalf("after uncertain failure: %+v", d)
	}
	// Metrics: one attached device after a good run, and reserve timings.
	b.prepareErr = nil
	reserve("s3") // gets a again
	if _, err := m.Prepare(ctx, "s3"); err != nil {
		t.Fatal(err)
	}
	if err := m.Attached("s3"); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, mt := range mf.GetMetric() {
			key := mf.GetName()
			for _, l := range mt.GetLabel() {
				key += "," + l.GetName() + "=" + l.GetValue()
			}
			switch {
			case mt.Gauge != nil:
				got[key] = mt.Gauge.GetValue()
			case mt.Counter != nil:
				got[key] = mt.Counter.GetValue()
			case mt.Histogram != nil:
				got[key] = float64(mt.Histogram.GetSampleCount())
			}
		}
	}
	for k, want := range map[string]float64{
		"cubicle_accelerators,class=gpu,state=attached":      1,
		"cubicle_accelerators,class=gpu,state=quarantined":   1,
		"cubicle_accelerator_op_duration_seconds,op=reserve": 3,
		"cubicle_accelerator_op_duration_seconds,op=prepare": 3,
		"cubicle_accelerator_events_total,type=quarantine":   1,
		"cubicle_accelerator_events_total,type=attach":       1,
	} {
		if got[k] != want {
			t.Errorf("%s = %v, want %v (all: %v)", k, got[k], want, got)
		}
	}
	// Every assignment, quarantine and release names the sandbox.
	var sawQuarantine bool
	for _, e := range m.Events(100) {
		if e.Type == "quarantine" && e.Device == "b" && e.Sandbox == "s2" {
			sawQuarantine = true
		}
	}
	if !sawQuarantine {
		t.Fatalf("no quarantine event with sandbox: %+v", m.Events(100))
	}
}

// A release waiting out a holder does not block reservations of other devices.
func TestManagerReleaseWaitDoesNotBlockReserve(t *testing.T) {
	b := &hostBackend{driver: map[string]string{"a": "nvidia", "b": "nvidia"}, holders: map[string][]int{}}
	m := newTestManager(t, t.TempDir(), b, "a", "b")
	m.cfg.ReleaseTimeout = time.Minute // the holder leaves long before
	ctx := context.Background()
	if err := m.Start(ctx, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Reserve(ctx, "s1", Request{Class: ClassGPU, Count: 1}, nil); err != nil {
		t.Fatal(err)
	}
	b.mu.Lock()
	b.holders["a"] = []int{4242}
	b.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- m.Release(ctx, "s1") }()
	for i := 0; i < 200; i++ { // until the release is inside its holder wait
		if d, _ := m.Get("a"); d.State == StateReleasing {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := m.Reserve(ctx, "s2", Request{Class: ClassGPU, Count: 1}, nil); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		t.Fatalf("reserve only got through after the release ended (%v)", err)
	default:
	}
	b.mu.Lock()
	b.holders["a"] = nil
	b.mu.Unlock()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if d, _ := m.Get("a"); d.State != StateAllocatable {
		t.Fatalf("after holder left: %+v", d)
	}
}

// Multi-device requests stay on one NUMA node when one can hold them.
func TestManagerReserveNUMA(t *testing.T) {
	b := &hostBackend{driver: map[string]string{"a": "nvidia", "b": "nvidia", "c": "nvidia"}, holders: map[string][]int{}}
	m := newTestManager(t, t.TempDir(), b, "a", "b", "c") // NUMA 0, 1, 0
	ctx := context.Background()
	if err := m.Start(ctx, func(string) bool { return false }); err != nil {
		t.Fatal(err)
	}
	ds, err := m.Reserve(ctx, "s1", Request{Class: ClassGPU, Count: 2}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 2 || ds[0].ID != "a" || ds[1].ID != "c" {
		t.Fatalf("picked %+v, want a and c (NUMA 0)", ds)
	}
	// Asking again for the same sandbox returns the same devices.
	again, err := m.Reserve(ctx, "s1", Request{Class: ClassGPU, Count: 2}, nil)
	if err != nil || len(again) != 2 || again[0].ID != "a" {
		t.Fatalf("idempotent reserve: %+v %v", again, err)
	}
	if _, err := m.Reserve(ctx, "s2", Request{Class: ClassGPU, Count: 2}, nil); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("2 of 1 free: %v", err)
	}
	if _, err := m.Reserve(ctx, "s3", Request{Class: ClassGPU, Count: 4}, nil); !errors.Is(err, ErrIncompatible) {
		t.Fatalf("more than the node has: %v", err)
	}
}
