package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// defaultMetricsListen is loopback, beside the API's default 127.0.0.1:3000.
const defaultMetricsListen = "127.0.0.1:3001"

// listenMetrics binds the /metrics listener (nil for "off"). It is its own
// listener rather than a route of the public one: the metrics name every
// team's pooled template IDs and how many sandboxes are live, and a
// scraper should not need an API key (an admin key would let it manage
// nodes and images too). Bound early, with the API's, so a taken port fails
// before anything touches the host.
func listenMetrics(addr string, log *slog.Logger) (net.Listener, error) {
	if addr == "off" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen %s: %w", addr, err)
	}
	if ap, err := netip.ParseAddrPort(ln.Addr().String()); err == nil && !ap.Addr().IsLoopback() {
		log.Warn("/metrics listens on a non-loopback address and has no authentication: it shows every team's pooled template IDs and sandbox counts; firewall it to your scraper", "metrics_listen", ln.Addr().String())
	}
	return ln, nil
}

// metricsHandler serves reg at /metrics and nothing else.
func metricsHandler(reg *prometheus.Registry) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	return mux
}
