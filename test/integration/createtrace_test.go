package integration

import (
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/phase"
)

// A create's answer carries its phases in a Server-Timing header (every
// phase of the path, user namespaces on by default, so idmap too), and
// /metrics has one sample of each in cubicle_create_phase_seconds.
func TestCreateServerTimingAndPhaseHistogram(t *testing.T) {
	s := startServer(t)
	c := s.create(map[string]any{"templateID": "base", "timeout": 60})
	if c.SandboxID == "" {
		t.Fatal("no sandbox")
	}
	h := s.lastHeader.Get("Server-Timing")
	t.Logf("Server-Timing: %s", h)
	got := map[string]float64{}
	for _, entry := range strings.Split(h, ",") {
		name, dur, ok := strings.Cut(strings.TrimSpace(entry), ";dur=")
		if !ok {
			t.Fatalf("Server-Timing entry %q in %q is not name;dur=ms", entry, h)
		}
		ms, err := strconv.ParseFloat(dur, 64)
		if err != nil || ms < 0 {
			t.Fatalf("Server-Timing entry %q: duration %q", entry, dur)
		}
		got[name] = ms
	}
	for _, name := range phase.Names {
		if _, ok := got[name]; !ok {
			t.Errorf("Server-Timing %q has no %s", h, name)
		}
	}
	for name, ms := range got {
		if name != phase.Total && ms > got[phase.Total] {
			t.Errorf("phase %s (%v ms) is longer than the create (%v ms)", name, ms, got[phase.Total])
		}
	}
	var wants []string
	for _, name := range phase.Names {
		wants = append(wants, fmt.Sprintf(`cubicle_create_phase_seconds_count{phase=%q,runtime="runc"} 1`, name))
	}
	s.requireMetrics(t, wants...)
}
