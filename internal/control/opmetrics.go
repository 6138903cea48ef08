package control

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// opMetrics counts lifecycle operations; registered only when a registry is given.
type opMetrics struct {
	ops      *prometheus.CounterVec
	duration *prometheus.HistogramVec
}

func newOpMetrics(reg prometheus.Registerer) *opMetrics {
	m := &opMetrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_sandbox_operations_total", Help: "Sandbox lifecycle operations by kind and result.",
		}, []string{"op", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cubicle_sandbox_operation_duration_seconds", Help: "Sandbox lifecycle operation latency.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 14),
		}, []string{"op"}),
	}
	if reg != nil {
		reg.MustRegister(m.ops, m.duration)
	}
	return m
}

// observe records one operation; use as defer m.observe("create", time.Now(), &err).
func (m *opMetrics) observe(op string, start time.Time, err *error) {
	result := "ok"
	if *err != nil {
		result = "error"
	}
	m.ops.WithLabelValues(op, result).Inc()
	m.duration.WithLabelValues(op).Observe(time.Since(start).Seconds())
}
