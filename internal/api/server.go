package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/volume/content"
)

// Config configures the API server.
type Config struct {
	// Domain is returned as the sandbox domain; empty means null (the SDK
	// then uses its own E2B_DOMAIN).
	Domain            string
	RetryAfterSeconds int
	MaxBodyBytes      int64
	Logger            *slog.Logger
	Registry          *prometheus.Registry
	// Templates enables the template catalog routes.
	Templates *Templates
	// Images is the local image store (cubicle image import).
	Images Images
}

// Server is the REST API.
type Server struct {
	cfg     Config
	mgr     *control.Manager
	store   store.Store
	log     *slog.Logger
	router  chi.Router
	metrics *metrics
	uploads uploads
}

type ctxKey int

const apiKeyCtx ctxKey = 1

// New builds the router.
func New(cfg Config, mgr *control.Manager, st store.Store) *Server {
	if cfg.RetryAfterSeconds == 0 {
		cfg.RetryAfterSeconds = 1
	}
	if cfg.MaxBodyBytes == 0 {
		cfg.MaxBodyBytes = 1 << 20
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	s := &Server{cfg: cfg, mgr: mgr, store: st, log: cfg.Logger, metrics: newMetrics(cfg.Registry, st)}
	r := chi.NewRouter()
	r.Use(s.instrument)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no route for "+r.Method+" "+r.URL.Path)
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, "method "+r.Method+" not allowed on "+r.URL.Path)
	})
	r.Get("/health", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	r.Handle("/metrics", promhttp.HandlerFor(cfg.Registry, promhttp.HandlerOpts{}))
	r.Group(func(r chi.Router) {
		r.Use(s.auth)
		r.Post("/sandboxes", s.createV1)
		r.Post("/v2/sandboxes", s.createV2)
		r.Get("/sandboxes", s.listV1)
		r.Get("/v2/sandboxes", s.listV2)
		r.Get("/sandboxes/{id}", s.get)
		r.Delete("/sandboxes/{id}", s.kill)
		r.Post("/sandboxes/{id}/timeout", s.setTimeout)
		r.Post("/sandboxes/{id}/refreshes", s.refresh)
		r.Post("/sandboxes/{id}/pause", s.pause)
		r.Post("/sandboxes/{id}/resume", s.resume)
		r.Post("/sandboxes/{id}/connect", s.connectV1)
		r.Post("/v2/sandboxes/{id}/connect", s.connectV2)
		r.Put("/sandboxes/{id}/network", s.updateNetwork)
		r.Get("/sandboxes/{id}/logs", s.logsV1)
		r.Get("/v2/sandboxes/{id}/logs", s.logsV2)
		r.Get("/sandboxes/{id}/metrics", s.metricsOne)
		r.Get("/sandboxes/metrics", s.metricsMany)
		r.Post("/volumes", s.createVolume)
		r.Get("/volumes", s.listVolumes)
		r.Get("/volumes/{volumeID}", s.getVolume)
		r.Delete("/volumes/{volumeID}", s.deleteVolume)
		s.templateRoutes(r)
		s.nodeRoutes(r)
		r.Post("/images", s.importImage)
		r.Get("/images", s.listImages)
		r.Delete("/images", s.deleteImage)
	})
	// The SDK uploads build contexts without an API key; the URL carries a token.
	r.Put("/template-uploads/{hash}", s.uploadContext)
	// Volume content authenticates with the volume's own token, not an API key.
	r.Handle("/volumecontent/*", content.NewHandler(contentResolver{mgr}, cfg.Logger))
	s.router = r
	return s
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.router.ServeHTTP(w, r) }

// HashKey is how API keys are stored.
func HashKey(key string) string {
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:])
}

func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.Header.Get("X-API-Key")
		if key == "" {
			if a := r.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
				key = strings.TrimSpace(a[7:])
			}
		}
		if key == "" {
			writeError(w, http.StatusUnauthorized, "missing API key: send X-API-Key or Authorization: Bearer")
			return
		}
		k, err := s.store.APIKeyByHash(r.Context(), HashKey(key))
		if err != nil {
			if errors.Is(err, store.ErrNotFound) {
				writeError(w, http.StatusUnauthorized, "Invalid API key")
				return
			}
			s.fail(w, r, err)
			return
		}
		if time.Since(k.LastUsed) > time.Minute {
			_ = s.store.TouchAPIKey(r.Context(), k.ID, time.Now())
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), apiKeyCtx, k)))
	})
}

func apiKeyOf(r *http.Request) *store.APIKey {
	k, _ := r.Context().Value(apiKeyCtx).(*store.APIKey)
	return k
}
