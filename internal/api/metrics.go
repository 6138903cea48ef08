package api

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubicle-dev/cubicle/internal/store"
)

type metrics struct {
	requests *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	unknown  *unknownFields
}

// maxUnknownNames bounds the distinct field names that get a label (and a
// log line) of their own: the names come from clients, and every label
// value is memory the registry keeps.
const maxUnknownNames = 64

// unknownFields counts the top-level request keys no route knows (newer
// SDKs' fields, accepted for forward compatibility); each name is logged
// once, so an operator learns what clients send that this server ignores.
type unknownFields struct {
	counter *prometheus.CounterVec
	mu      sync.Mutex
	seen    map[string]bool
}

// note counts the unknown keys of one request to route; logf is called
// once per name (and once when the name budget runs out).
func (u *unknownFields) note(route string, names []string, logf func(name string)) {
	u.mu.Lock()
	defer u.mu.Unlock()
	for _, n := range names {
		label := n
		if len(label) > 64 {
			label = strings.ToValidUTF8(label[:64], "") + "..."
		}
		if !u.seen[label] {
			if len(u.seen) >= maxUnknownNames {
				label = "_other"
			}
			if !u.seen[label] {
				u.seen[label] = true
				logf(label)
			}
		}
		u.counter.WithLabelValues(route, label).Inc()
	}
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
	m.unknown = &unknownFields{seen: map[string]bool{}, counter: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "cubicle_api_unknown_fields_total",
		Help: "Top-level request body fields this server does not know and ignored, by route and name (names past the first 64 count as _other).",
	}, []string{"route", "field"})}
	reg.MustRegister(m.requests, m.latency, sandboxes, m.unknown.counter)
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
