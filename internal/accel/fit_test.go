package accel

import (
	"errors"
	"slices"
	"testing"
)

// FitInventory judges a reported inventory exactly as the manager judges
// its own: the cluster scheduler depends on it.
func TestFitInventoryOverAReportedInventory(t *testing.T) {
	dev := func(id string, s State, drv string) Device {
		return Device{ID: id, Class: ClassGPU, Vendor: "nvidia", Backend: BackendPassthrough, DriverVersion: drv, State: s}
	}
	inv := []Device{dev("gpu-a", StateAttached, "550"), dev("gpu-b", StateAllocatable, "550"), dev("gpu-c", StateAllocatable, "470"), dev("gpu-d", StateAllocatable, "550")}
	c := &Contract{DriverVersion: ">=535"}
	free, err := FitInventory("n1", inv, Request{Class: ClassGPU, Count: 2}, c, StageScheduling)
	if err != nil || !slices.Equal(free, []int{1, 3}) {
		t.Fatalf("free %v, %v; want the allocatable devices within the driver range", free, err)
	}
	if _, err := FitInventory("n1", inv, Request{Class: ClassGPU, Count: 3}, c, StageScheduling); !errors.Is(err, ErrNoCapacity) {
		t.Fatalf("3 of 3 matching with one attached: %v, want ErrNoCapacity", err)
	}
	_, err = FitInventory("n1", inv, Request{Class: ClassGPU, Count: 1}, &Contract{DriverVersion: ">=600"}, StageScheduling)
	var ce *CompatError
	if !errors.As(err, &ce) || ce.Layer != LayerDriver || ce.Device != "gpu-a" {
		t.Fatalf("no driver in range: %v, want the driver layer of the first device", err)
	}
	if _, err := FitInventory("n1", nil, Request{Class: ClassTPU, Count: 1}, nil, StageScheduling); !errors.As(err, &ce) || ce.Layer != LayerHardware {
		t.Fatalf("empty inventory: %v", err)
	}
}
