package control

import "github.com/prometheus/client_golang/prometheus"

// snapshotMetrics publishes what snapshots hold on disk.
type snapshotMetrics struct {
	count, bytes prometheus.Gauge
}

func newSnapshotMetrics(reg prometheus.Registerer) *snapshotMetrics {
	m := &snapshotMetrics{
		count: prometheus.NewGauge(prometheus.GaugeOpts{Name: "cubicle_snapshots", Help: "Snapshots that exist (deleted ones still in use are not counted)."}),
		bytes: prometheus.NewGauge(prometheus.GaugeOpts{Name: "cubicle_snapshot_bytes", Help: "Bytes of snapshot layers and memory images on disk, deleted ones still in use included."}),
	}
	if reg != nil {
		reg.MustRegister(m.count, m.bytes)
	}
	return m
}

func (m *snapshotMetrics) set(count, bytes float64) {
	m.count.Set(count)
	m.bytes.Set(bytes)
}
