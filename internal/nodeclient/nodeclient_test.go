package nodeclient

import (
	"errors"
	"math"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// A node's reported capacity is its own fact, but one that would wrap the
// scheduler's arithmetic (capacity times the CPU overcommit, converted
// back to int64) is refused; the bounds themselves pass.
func TestStatusCapacityBounds(t *testing.T) {
	ok := Status{Address: "10.0.0.1:7443", DataAddress: "10.0.0.1:7444", Runtime: "runc"}
	for _, c := range []struct {
		cap  store.Capacity
		want bool
	}{
		{store.Capacity{MilliCPU: 64000, MemoryMiB: 256 << 10, DiskMiB: 4 << 20}, true},
		{store.Capacity{MilliCPU: MaxMilliCPU, MemoryMiB: MaxCapacityMiB, DiskMiB: MaxCapacityMiB}, true},
		{store.Capacity{MilliCPU: math.MaxInt64}, false},
		{store.Capacity{MemoryMiB: math.MaxInt64}, false},
		{store.Capacity{DiskMiB: MaxCapacityMiB + 1}, false},
		{store.Capacity{MilliCPU: -1}, false},
	} {
		st := ok
		st.Capacity = c.cap
		err := st.Validate()
		if (err == nil) != c.want || (err != nil && !errors.Is(err, ErrInvalidStatus)) {
			t.Errorf("capacity %+v: %v, want accepted=%v", c.cap, err, c.want)
		}
	}
}
