package api

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubicle-dev/cubicle/internal/store"
)

type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
}

func newMetrics(reg *prometheus.Registry, st store.Store) *metrics {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "cubicle_api_requests_total", Help: "API requests by route and status.",
		}, []string{"method", "route", "status"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "cubicle_api_request_duration_seconds", Help: "API request latency by route.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"method", "route"}),
	}
	sandboxes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "cubicle_sandboxes_live", Help: "Sandboxes not yet killed.",
	}, func() float64 {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		n, _ := st.CountSandboxes(ctx, []store.SandboxState{store.StateCreating, store.StateRunning, store.StatePausing, store.StatePaused, store.StateResuming})
		return float64(n)
	})
	reg.MustRegister(m.requests, m.latency, sandboxes)
	return m
}

type statusWriter struct {
	http.ResponseWriter
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (s *Server) instrument(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		sw := &statusWriter{ResponseWriter: w}
		next.ServeHTTP(sw, r)
		route := chi.RouteContext(r.Context()).RoutePattern()
		if route == "" {
			route = "unmatched"
		}
		if sw.status == 0 {
			sw.status = http.StatusOK
		}
		s.metrics.requests.WithLabelValues(r.Method, route, strconv.Itoa(sw.status)).Inc()
		s.metrics.latency.WithLabelValues(r.Method, route).Observe(time.Since(start).Seconds())
	})
}
