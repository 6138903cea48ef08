package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template/catalog"
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
	// MaxImageBytes caps an image import body (default 4 GiB); above it 413.
	MaxImageBytes int64
	// Secrets enables the /secrets routes (the team secrets service).
	Secrets *secret.Secrets
	// Join enables POST /nodes/join (nodes joining the cluster) and the
	// node calls (register, heartbeat, renew, secret) of joined nodes.
	Join *nodejoin.Service
	// VolumeNodes passes volume-content requests to the remote node that
	// holds the volume (a *dataplane.VolumeProxy); nil: no remote nodes.
	VolumeNodes VolumeNodes
	// HostMountTeams may ask for host mounts (metadata["host-mount"])
	// besides admin keys: a tenant must never name a host path unless the
	// operator said so.
	HostMountTeams []string
}

// VolumeNodes gives the handler that serves a volume-content request on
// remote node nodeID.
type VolumeNodes interface {
	Handler(nodeID string) http.Handler
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
	if cfg.MaxImageBytes == 0 {
		cfg.MaxImageBytes = DefaultMaxImageBytes
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
	// A JSON body: the cubesandbox SDK's Sandbox.health() decodes one.
	r.Get("/health", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	// No /metrics here: it names every team's pooled templates, so serve
	// exposes it on its own loopback listener (--metrics-listen).
	r.Group(func(r chi.Router) {
		r.Use(s.auth)
		r.Get("/teams", s.listTeams)
		r.Post("/sandboxes", s.createV1)
		r.Post("/v2/sandboxes", s.createV2)
		r.Get("/sandboxes", s.listV1)
		r.Get("/v2/sandboxes", s.listV2)
		r.Get("/sandboxes/metrics", s.metricsMany)
		// The routes naming a sandbox are team-scoped by the request
		// context (auth sets control.WithTeam): another team's sandbox is a
		// 404 like a missing one, after the body was validated as usual.
		r.Get("/sandboxes/{id}", s.get)
		r.Delete("/sandboxes/{id}", s.kill)
		r.Post("/sandboxes/{id}/timeout", s.setTimeout)
		r.Post("/sandboxes/{id}/refreshes", s.refresh)
		r.Post("/sandboxes/{id}/pause", s.pause)
		r.Post("/sandboxes/{id}/resume", s.resume)
		r.Post("/sandboxes/{id}/connect", s.connectV1)
		r.Post("/v2/sandboxes/{id}/connect", s.connectV2)
		r.Put("/sandboxes/{id}/network", s.updateNetwork)
		r.Post("/sandboxes/{id}/snapshots", s.createSnapshot)
		r.Post("/sandboxes/{id}/fork", s.fork)
		r.Post("/sandboxes/{id}/rollback", s.rollback)
		r.Get("/snapshots", s.listSnapshots)
		r.Get("/snapshots/{snapshotID}", s.getSnapshot)
		r.Delete("/snapshots/{snapshotID}", s.deleteSnapshot)
		r.Get("/sandboxes/{id}/logs", s.logsV1)
		r.Get("/v2/sandboxes/{id}/logs", s.logsV2)
		r.Get("/sandboxes/{id}/metrics", s.metricsOne)
		r.Post("/volumes", s.createVolume)
		r.Get("/volumes", s.listVolumes)
		r.Get("/volumes/{volumeID}", s.getVolume)
		r.Delete("/volumes/{volumeID}", s.deleteVolume)
		if cfg.Secrets != nil {
			s.secretRoutes(r)
		}
		s.templateRoutes(r)
		// What every team shares: only admin keys manage it.
		r.Group(func(r chi.Router) {
			r.Use(s.adminOnly)
			s.nodeRoutes(r)
			s.policyRoutes(r)
			r.Post("/images", s.importImage)
			r.Get("/images", s.listImages)
			r.Delete("/images", s.deleteImage)
		})
	})
	// A joining node has no API key; its join token is the credential.
	if cfg.Join != nil {
		s.joinRoutes(r)
		s.nodeCallRoutes(r)
	}
	// The SDK uploads build contexts without an API key; the URL carries a token.
	r.Put("/template-uploads/{hash}", s.uploadContext)
	// Volume content authenticates with the volume's own token, not an API key.
	r.Handle("/volumecontent/*", content.NewHandler(contentResolver{mgr, cfg.VolumeNodes}, cfg.Logger))
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

// presentedKey is the API key the request carries (X-API-Key, else a
// bearer token, which is what the e2b CLI sends).
func presentedKey(r *http.Request) string {
	key := r.Header.Get("X-API-Key")
	if key == "" {
		if a := r.Header.Get("Authorization"); len(a) > 7 && strings.EqualFold(a[:7], "bearer ") {
			key = strings.TrimSpace(a[7:])
		}
	}
	return key
}

// auth looks the key up on every request (nothing caches it), so a revoked
// key fails on its next request.
func (s *Server) auth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := presentedKey(r)
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
		if k.TeamID == store.SystemTeamID {
			writeError(w, http.StatusUnauthorized, "Invalid API key")
			return
		}
		if time.Since(k.LastUsed) > time.Minute {
			_ = s.store.TouchAPIKey(r.Context(), k.ID, time.Now())
		}
		ctx := control.WithTeam(context.WithValue(r.Context(), apiKeyCtx, k), k.TeamID)
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

func apiKeyOf(r *http.Request) *store.APIKey {
	k, _ := r.Context().Value(apiKeyCtx).(*store.APIKey)
	return k
}

// teamOf is the team of the request's key. Routes behind auth always have
// one; "" (no key) matches no team's objects.
func teamOf(r *http.Request) string {
	if k := apiKeyOf(r); k != nil {
		return k.TeamID
	}
	return "\x00no-team"
}

// callerOf is the request's key as the template catalog sees it.
func callerOf(r *http.Request) catalog.Caller {
	k := apiKeyOf(r)
	if k == nil {
		return catalog.Caller{TeamID: teamOf(r)}
	}
	return catalog.Caller{TeamID: k.TeamID, Admin: k.Admin}
}

// adminOnly guards what all teams share (nodes, accelerators, images).
func (s *Server) adminOnly(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k := apiKeyOf(r); k == nil || !k.Admin {
			writeError(w, http.StatusForbidden, "this route needs an admin API key (cubicle apikey create --admin)")
			return
		}
		next.ServeHTTP(w, r)
	})
}

// sandboxOf returns the team's live sandbox id (a belt to the request
// context's braces: control.Get is already team-scoped by it).
func (s *Server) sandboxOf(r *http.Request, id string) (*store.Sandbox, error) {
	sb, err := s.mgr.Get(r.Context(), id)
	if err != nil {
		return nil, err
	}
	if sb.TeamID != teamOf(r) {
		return nil, fmt.Errorf("%w: sandbox '%s' not found", control.ErrNotFound, id)
	}
	return sb, nil
}

// teamJSON is e2b's Team (GET /teams, which the e2b CLI's login reads).
// apiKey echoes the key the request presented: only its hash is stored.
type teamJSON struct {
	TeamID    string `json:"teamID"`
	Name      string `json:"name"`
	APIKey    string `json:"apiKey"`
	IsDefault bool   `json:"isDefault"`
}

// listTeams answers for the key's own team only.
func (s *Server) listTeams(w http.ResponseWriter, r *http.Request) {
	t, err := s.store.GetTeam(r.Context(), teamOf(r))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, []teamJSON{{TeamID: t.ID, Name: t.Name, APIKey: presentedKey(r), IsDefault: true}})
}
