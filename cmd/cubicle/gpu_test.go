package main

import (
	"errors"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/accel"
)

func TestParseAccelFlag(t *testing.T) {
	r, err := parseAccelFlag("class=gpu,count=2,vendor=nvidia,min-memory-mb=40000,label.model=h100")
	if err != nil || r.Class != accel.ClassGPU || r.Count != 2 || r.Vendor != "nvidia" || r.MinMemoryMB != 40000 || r.Labels["model"] != "h100" {
		t.Fatalf("%+v %v", r, err)
	}
	for _, bad := range []string{"gpu", "count=x", "colour=red", "class=fpga", "count=0"} {
		if _, err := parseAccelFlag(bad); err == nil {
			t.Fatalf("%q accepted", bad)
		}
	}
	if _, err := parseAccelFlag("count=99"); !errors.Is(err, accel.ErrInvalid) {
		t.Fatalf("count=99: %v", err)
	}
}
