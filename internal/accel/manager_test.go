package accel

import (
	"context"
	"errors"
	"sync"
	"testing"
)

// hostBackend stands in for hardware: the test sets what the host shows.
type hostBackend struct {
	mu      sync.Mutex
	driver  map[string]string
	holders map[string][]int
}

func (b *hostBackend) Type() BackendType      { return BackendPassthrough }
func (b *hostBackend) Validate(*Device) error { return nil }
func (b *hostBackend) Prepare(_ context.Context, d *Device, _ string) (Attachment, error) {
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
	m, err := NewManager(ManagerConfig{NodeID: "n1", StateDir: dir, Backends: map[BackendType]Backend{BackendPassthrough: b},
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
