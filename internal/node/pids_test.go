package node

import "testing"

func TestPIDsFor(t *testing.T) {
	for _, c := range []struct {
		fixed int64
		mem   int
		want  int64
	}{
		{0, 512, 512}, {0, 64, 256}, {0, 16384, 4096}, {1000, 512, 1000},
	} {
		if got := PIDsFor(c.fixed, c.mem); got != c.want {
			t.Errorf("PIDsFor(%d, %d) = %d, want %d", c.fixed, c.mem, got, c.want)
		}
	}
}
