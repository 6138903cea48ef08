package control

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubicle-dev/cubicle/internal/volume"
)

// VolumeMetrics counts volume operations and plugin calls, for the control
// plane (create/delete) and the node (attach/detach) alike.
type VolumeMetrics struct {
	ops          *prometheus.CounterVec
	attach       *prometheus.HistogramVec
	pluginErrors *prometheus.CounterVec
}

// NewVolumeMetrics registers the collectors when reg is non-nil.
func NewVolumeMetrics(reg prometheus.Registerer) *VolumeMetrics {
	m := &VolumeMetrics{
		ops: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_volume_operations_total", Help: "Volume operations (create, delete, attach, detach) by driver and result.",
		}, []string{"op", "driver", "result"}),
		attach: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cubicle_volume_attach_duration_seconds", Help: "Latency of the Attach hook by driver.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"driver"}),
		pluginErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_volume_plugin_errors_total", Help: "Failed plugin hook calls by driver, hook and kind (failed, timeout, protocol).",
		}, []string{"driver", "op", "kind"}),
	}
	if reg != nil {
		reg.MustRegister(m.ops, m.attach, m.pluginErrors)
	}
	return m
}

func result(err error) string {
	if err != nil {
		return "error"
	}
	return "ok"
}

func errKind(err error) string {
	switch {
	case errors.Is(err, volume.ErrPluginTimeout):
		return "timeout"
	case errors.Is(err, volume.ErrProtocol):
		return "protocol"
	default:
		return "failed"
	}
}

func (m *VolumeMetrics) op(op, driver string, start time.Time, err error) {
	m.ops.WithLabelValues(op, driver, result(err)).Inc()
}

func (m *VolumeMetrics) pluginError(driver, op string, err error) {
	m.pluginErrors.WithLabelValues(driver, op, errKind(err)).Inc()
}

// PluginCall implements node.VolumeMetrics.
func (m *VolumeMetrics) PluginCall(driver, op string, d time.Duration, err error) {
	m.ops.WithLabelValues(op, driver, result(err)).Inc()
	if op == "attach" {
		m.attach.WithLabelValues(driver).Observe(d.Seconds())
	}
	if err != nil {
		m.pluginErrors.WithLabelValues(driver, op, errKind(err)).Inc()
	}
}
