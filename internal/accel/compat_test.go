package accel

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateRequest(t *testing.T) {
	ok := Request{Class: ClassGPU, Count: 1}
	if err := ValidateRequest(ok); err != nil {
		t.Fatal(err)
	}
	bad := []Request{
		{Class: "fpga", Count: 1},
		{Class: ClassGPU, Count: 0},
		{Class: ClassGPU, Count: 17},
		{Class: ClassGPU, Count: 1, Backend: "sriov"},
		{Class: ClassGPU, Count: 1, Labels: map[string]string{"": "x"}},
		{Class: ClassGPU, Count: 1, Labels: map[string]string{strings.Repeat("k", 64): "x"}},
		{Class: ClassGPU, Count: 1, MinMemoryMB: -1},
	}
	for i, r := range bad {
		if err := ValidateRequest(r); !errors.Is(err, ErrInvalid) {
			t.Errorf("%d: %+v: got %v, want ErrInvalid", i, r, err)
		}
	}
}

func TestValidateContract(t *testing.T) {
	for _, c := range []Contract{
		{},
		{Class: ClassGPU, DriverVersion: ">=535 <600", CUDAVersion: "12.4"},
		{Backend: BackendVFIO, GuestKernel: "k", ModulesImage: "m", PinMemory: true},
		{DriverVersion: "=550.54.15", Count: 16},
	} {
		if err := ValidateContract(c); err != nil {
			t.Errorf("%+v: %v", c, err)
		}
	}
	for _, tc := range []struct {
		c     Contract
		layer Layer
	}{
		{Contract{Class: "fpga"}, LayerTemplate},
		{Contract{Count: 17}, LayerTemplate},
		{Contract{Count: -1}, LayerTemplate},
		{Contract{DriverVersion: ">=abc"}, LayerDriver},
		{Contract{DriverVersion: "~535"}, LayerDriver},
		{Contract{CUDAVersion: "12..4"}, LayerCUDA},
		{Contract{GuestKernel: "k"}, LayerGuestKernel},
		{Contract{Backend: BackendPassthrough, ModulesImage: "m"}, LayerModulesImage},
		{Contract{PinMemory: true}, LayerMemory},
	} {
		err := ValidateContract(tc.c)
		var ce *CompatError
		if !errors.As(err, &ce) || ce.Stage != StageRegistration || ce.Layer != tc.layer || !errors.Is(err, ErrIncompatible) {
			t.Errorf("%+v: got %v, want %s at registration", tc.c, err, tc.layer)
		}
	}
}

func TestRange(t *testing.T) {
	for _, tc := range []struct {
		r, v string
		ok   bool
	}{
		{">=535", "535", true}, {">=535", "550.54.15", true}, {">=535", "470.1", false},
		{">=12.0 <13", "12.4", true}, {">=12.0 <13", "13.0", false}, {"12.4", "12.4.0", true},
		{"=12.4", "12.5", false}, {">12", "12", false}, {"<=12", "12.0", true}, {"", "1", true},
	} {
		r, err := ParseRange(tc.r)
		if err != nil {
			t.Fatal(err)
		}
		v, err := ParseVersion(tc.v)
		if err != nil {
			t.Fatal(err)
		}
		if r.Contains(v) != tc.ok {
			t.Errorf("%q contains %q = %v", tc.r, tc.v, !tc.ok)
		}
	}
}

func TestEffective(t *testing.T) {
	c := &Contract{Class: ClassGPU, Count: 2, Labels: map[string]string{"model": "h100"}, Backend: BackendPassthrough, MinMemoryMB: 100}
	r, err := Effective(nil, c)
	if err != nil || r.Class != ClassGPU || r.Count != 2 || r.Labels["model"] != "h100" || r.Backend != BackendPassthrough || r.MinMemoryMB != 100 {
		t.Fatalf("%+v %v", r, err)
	}
	r, err = Effective(nil, &Contract{Class: ClassGPU})
	if err != nil || r.Count != 1 {
		t.Fatalf("%+v %v", r, err)
	}
	req := &Request{Class: ClassGPU, Count: 1, Labels: map[string]string{"zone": "a"}}
	r, err = Effective(req, c)
	if err != nil || r.Count != 1 || r.Labels["zone"] != "a" || r.Labels["model"] != "h100" {
		t.Fatalf("%+v %v", r, err)
	}
	if _, ok := req.Labels["model"]; ok {
		t.Fatal("request labels mutated")
	}
	for _, bad := range []*Request{
		{Class: ClassTPU, Count: 1},
		{Class: ClassGPU, Count: 1, Labels: map[string]string{"model": "a100"}},
		{Class: ClassGPU, Count: 1, Backend: BackendVFIO},
	} {
		_, err := Effective(bad, c)
		var ce *CompatError
		if !errors.As(err, &ce) || ce.Stage != StageScheduling || ce.Layer != LayerTemplate {
			t.Errorf("%+v: %v", bad, err)
		}
	}
	r, err = Effective(&Request{Class: ClassGPU, Count: 3}, nil)
	if err != nil || r.Count != 3 {
		t.Fatal(r, err)
	}
}

func TestMatch(t *testing.T) {
	dev := Device{ID: "gpu-0", Class: ClassGPU, Vendor: "nvidia", VendorID: "0x10de", MemoryMB: 80000,
		Labels: map[string]string{"model": "h100"}, Backend: BackendPassthrough, DriverVersion: "550.54.15", CUDAVersion: "12.4"}
	req := Request{Class: ClassGPU, Count: 1}
	if e := Match(dev, req, nil, StageScheduling); e != nil {
		t.Fatal(e)
	}
	full := &Contract{DriverVersion: ">=535", CUDAVersion: ">=12.0 <13", Vendor: "nvidia"}
	if e := Match(dev, Request{Class: ClassGPU, Vendor: "0x10de", Labels: map[string]string{"model": "h100"}, MinMemoryMB: 80000, Backend: BackendPassthrough}, full, StageReservation); e != nil {
		t.Fatal(e)
	}
	noDriver := dev
	noDriver.DriverVersion = ""
	vfioDev := dev
	vfioDev.Backend = BackendVFIO
	for name, tc := range map[string]struct {
		dev   Device
		req   Request
		c     *Contract
		layer Layer
	}{
		"class":       {dev, Request{Class: ClassTPU}, nil, LayerHardware},
		"vendor":      {dev, Request{Class: ClassGPU, Vendor: "amd"}, nil, LayerHardware},
		"vendor-c":    {dev, req, &Contract{Vendor: "intel"}, LayerHardware},
		"label":       {dev, Request{Class: ClassGPU, Labels: map[string]string{"model": "a100"}}, nil, LayerHardware},
		"label-miss":  {dev, Request{Class: ClassGPU, Labels: map[string]string{"x": "y"}}, nil, LayerHardware},
		"memory":      {dev, Request{Class: ClassGPU, MinMemoryMB: 90000}, nil, LayerHardware},
		"memory-c":    {dev, req, &Contract{MinMemoryMB: 90000}, LayerHardware},
		"backend":     {dev, Request{Class: ClassGPU, Backend: BackendVFIO}, nil, LayerBackend},
		"backend-c":   {dev, req, &Contract{Backend: BackendVFIO}, LayerBackend},
		"driver":      {dev, req, &Contract{DriverVersion: ">=560"}, LayerDriver},
		"driver-none": {noDriver, req, &Contract{DriverVersion: ">=535"}, LayerDriver},
		"cuda":        {dev, req, &Contract{CUDAVersion: ">=12.6"}, LayerCUDA},
		"guestkernel": {dev, req, &Contract{GuestKernel: "vmlinux"}, LayerGuestKernel},
		"modules":     {dev, req, &Contract{ModulesImage: "m.img"}, LayerModulesImage},
	} {
		e := Match(tc.dev, tc.req, tc.c, StageReservation)
		if e == nil || e.Layer != tc.layer || e.Stage != StageReservation || e.Device != "gpu-0" {
			t.Errorf("%s: got %v, want layer %s", name, e, tc.layer)
		}
	}
	if e := Match(vfioDev, req, &Contract{GuestKernel: "vmlinux", ModulesImage: "m"}, StageScheduling); e != nil {
		t.Errorf("vfio device with guest kernel: %v", e)
	}
	if e := Match(noDriver, req, nil, StageScheduling); e != nil {
		t.Errorf("no range, no version: %v", e)
	}
}

func TestTransitionTable(t *testing.T) {
	owners := []Owner{OwnerNode, OwnerRuntime, OwnerAdmin}
	n := 0
	for _, from := range States {
		for _, to := range States {
			want, listed := transitions[edge{from, to}]
			if listed {
				n++
			}
			for _, o := range owners {
				err := CheckTransition(from, to, o)
				legal := listed && o == want
				if legal != (err == nil) {
					t.Errorf("%s->%s by %s: err=%v, legal=%v", from, to, o, err, legal)
				}
				if err != nil && !errors.Is(err, ErrIllegalTransition) {
					t.Errorf("%s->%s: %v not ErrIllegalTransition", from, to, err)
				}
			}
			got, ok := TransitionOwner(from, to)
			if ok != listed || got != want {
				t.Errorf("TransitionOwner(%s,%s)", from, to)
			}
		}
	}
	if n != len(transitions) {
		t.Errorf("table has edges outside States: %d vs %d", n, len(transitions))
	}
	// spot checks of the proposal's model
	must := map[[2]State]Owner{
		{StateAllocatable, StateReserved}:    OwnerNode,
		{StatePreparing, StateAttached}:      OwnerRuntime,
		{StateAttached, StateReleasing}:      OwnerRuntime,
		{StateQuarantined, StateAllocatable}: OwnerAdmin,
		{StateDisabled, StateInitialized}:    OwnerAdmin,
		{StateAttached, StateDisabled}:       OwnerAdmin,
	}
	for e, o := range must {
		if err := CheckTransition(e[0], e[1], o); err != nil {
			t.Error(err)
		}
	}
	for _, e := range [][2]State{{StateAttached, StateAllocatable}, {StateReserved, StateAllocatable}, {StateReleasing, StateAllocatable}, {StateDisabled, StateAllocatable}} {
		if CheckTransition(e[0], e[1], OwnerNode) == nil || CheckTransition(e[0], e[1], OwnerAdmin) == nil {
			t.Errorf("%s->%s must be illegal", e[0], e[1])
		}
	}
}
