package control

import (
	"time"

	"github.com/cubicle-dev/cubicle/internal/phase"
	"github.com/prometheus/client_golang/prometheus"
)

// phaseMetrics is cubicle_create_phase_seconds: each phase of every
// create that booted a sandbox, the node's phases included (a remote
// node returns them in its create answer).
type phaseMetrics struct {
	seconds *prometheus.HistogramVec
}

func newPhaseMetrics(reg prometheus.Registerer) *phaseMetrics {
	m := &phaseMetrics{seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "cubicle_create_phase_seconds",
		Help: "Time a sandbox create spent in each phase (phases overlap: lock_wait is also inside the phase that waited; total is the wall time).",
		// 0.5 ms to 16 s: a store write to a c=50 queue.
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
	}, []string{"phase", "runtime"})}
	if reg != nil {
		reg.MustRegister(m.seconds)
	}
	return m
}

// observe records tr's phases and the total since start, for a create
// that succeeded and booted on a node (a trace names its runtime only
// then: a pooled claim boots nothing, so its phases would mix two paths).
func (m *phaseMetrics) observe(tr *phase.Trace, start time.Time, err *error) {
	tr.Add(phase.Total, time.Since(start))
	rt := tr.Runtime()
	if *err != nil || rt == "" {
		return
	}
	for _, p := range tr.Phases() {
		m.seconds.WithLabelValues(p.Name, rt).Observe(p.Duration.Seconds())
	}
}
