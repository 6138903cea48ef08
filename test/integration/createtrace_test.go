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
	requirePhases(t, s)
}

// Through a remote node (`cubicle node run`, a pure control plane on
// PostgreSQL): the node's phases come back in its gRPC create answer, so
// the replica's header and histogram have them as the embedded node's.
func TestClusterCreateTrace(t *testing.T) {
	c := startCluster(t, 1, 1, clusterOptions{})
	r := c.replicas[0]
	sb := r.create(map[string]any{"templateID": "base", "timeout": 60})
	if row := c.row(sb.SandboxID); row.Node != c.nodes[0].ID {
		t.Fatalf("sandbox on node %q, want the remote %s", row.Node, c.nodes[0].ID)
	}
	requirePhases(t, r)
}

// requirePhases checks the last create's Server-Timing names every phase
// (each within the create's total) and s's /metrics has one sample of each.
func requirePhases(t *testing.T, s *server) {
	t.Helper()
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
