// Package agent is cubicle-agent, an envd-compatible in-sandbox agent: the REST
// routes of envd (/health, /init, /envs, /metrics, /files) and the Connect-RPC
// services process.Process and filesystem.Filesystem on one HTTP server.
package agent

import (
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"maps"
	"net/http"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/agent/cors"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/filesystem/filesystemconnect"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/process/processconnect"
)

// Version is the agent's own version, set at build time with -ldflags.
var Version = "dev"

// Port is envd's well-known port.
const Port = 49983

// Sentinel errors.
var (
	ErrUserNotFound  = errors.New("agent: user not found")
	ErrInvalidPath   = errors.New("agent: invalid path")
	ErrUnauthorized  = errors.New("agent: unauthorized")
	ErrNotFound      = errors.New("agent: not found")
	ErrAlreadyExists = errors.New("agent: already exists")
	ErrNotDir        = errors.New("agent: not a directory")
	ErrIsDir         = errors.New("agent: is a directory")
)

// Config configures an Agent. The zero value is usable.
type Config struct {
	// PasswdPath and GroupPath are the user database (default /etc/passwd, /etc/group).
	PasswdPath string
	GroupPath  string
	// ReapAll makes the agent reap every child with wait4(-1) and dispatch statuses
	// to the processes it started; orphans reparented to it are reaped silently.
	// Set it when running as PID 1 or as a child subreaper. When false each child
	// is waited for by pid, which leaves other children of this process alone
	// (what tests and embedding need).
	ReapAll bool
	// AccessToken, DefaultUser, DefaultWorkdir and EnvVars are initial values
	// that POST /init may replace. AccessToken is required: an agent without
	// one refuses every authenticated route and /init (it never serves
	// token-less, docs/security.md "The agent's token").
	AccessToken    string
	DefaultUser    string
	DefaultWorkdir string
	EnvVars        map[string]string
	// LogDir holds the template start command's log and status files
	// (default DefaultLogDir).
	LogDir string
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Root is the tree whose trust store /init's egressCA goes into
	// (default "/").
	Root string
}

// Agent serves the envd API.
type Agent struct {
	cfg    Config
	log    *slog.Logger
	reaper *reaper

	mu             sync.RWMutex
	token          string
	defaultUser    string
	defaultWorkdir string
	envVars        map[string]string
	// startClaimed is set once a start command was started (or found already
	// started this boot); later /init calls never start one again.
	startClaimed bool
	startProc    *startProc

	procs    *processTable
	services *serviceTable
	watchers *watcherTable
	metrics  metricsState
}

// New creates an Agent. It starts the reaper goroutine when cfg.ReapAll is set.
func New(cfg Config) *Agent {
	if cfg.PasswdPath == "" {
		cfg.PasswdPath = "/etc/passwd"
	}
	if cfg.GroupPath == "" {
		cfg.GroupPath = "/etc/group"
	}
	if cfg.Root == "" {
		cfg.Root = "/"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a := &Agent{
		cfg:            cfg,
		log:            cfg.Logger,
		reaper:         newReaper(cfg.ReapAll),
		token:          cfg.AccessToken,
		defaultUser:    cfg.DefaultUser,
		defaultWorkdir: cfg.DefaultWorkdir,
		envVars:        maps.Clone(cfg.EnvVars),
		procs:          newProcessTable(),
		services:       newServiceTable(),
		watchers:       newWatcherTable(),
	}
	if a.envVars == nil {
		a.envVars = map[string]string{}
	}
	return a
}

// Handler returns the agent's HTTP handler. It speaks whatever protocols its
// server does; Server enables HTTP/1.1 and h2c (prior knowledge).
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	opts := []connect.HandlerOption{}
	mux.Handle(processconnect.NewProcessHandler(&processService{a: a}, opts...))
	mux.Handle(filesystemconnect.NewFilesystemHandler(&filesystemService{a: a}, opts...))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /init", a.handleInit)
	mux.HandleFunc("GET /envs", a.handleEnvs)
	mux.HandleFunc("GET /metrics", a.handleMetrics)
	mux.HandleFunc("GET /files", a.handleDownload)
	mux.HandleFunc("POST /files", a.handleUpload)
	mux.HandleFunc("POST /cubicle/accelerators/check", a.handleAccelCheck)
	var h http.Handler = mux
	h = a.userMiddleware(h)
	h = a.tokenMiddleware(h)
	h = cors.Handler(h, exposedHeaders)
	return h
}

// Server returns an http.Server for addr serving Handler over HTTP/1.1 and
// unencrypted HTTP/2 (h2c, needed for client-streaming StreamInput). It uses
// net/http's native h2c support instead of x/net/http2/h2c, which would pull
// extra modules into go.mod.
func (a *Agent) Server(addr string) *http.Server {
	srv := &http.Server{
		Addr:              addr,
		Handler:           a.Handler(),
		ReadHeaderTimeout: 30 * time.Second,
		IdleTimeout:       10 * time.Minute,
	}
	EnableH2C(srv)
	return srv
}

// EnableH2C turns on HTTP/1.1 and h2c on srv.
func EnableH2C(srv *http.Server) {
	var p http.Protocols
	p.SetHTTP1(true)
	p.SetUnencryptedHTTP2(true)
	srv.Protocols = &p
}

// Shutdown terminates every running process group (SIGTERM, then SIGKILL after
// a bounded grace), service processes (Spawn) included, and closes all
// watchers.
func (a *Agent) Shutdown() {
	a.watchers.closeAll()
	a.mu.RLock()
	sp := a.startProc
	a.mu.RUnlock()
	done, svcDone := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		if sp != nil {
			sp.terminate()
		}
	}()
	go func() {
		defer close(svcDone)
		a.services.terminateAll()
	}()
	a.procs.terminateAll()
	<-done
	<-svcDone
}

// exposedHeaders are what the SDKs read from envd's responses in a browser.
const exposedHeaders = "Connect-Protocol-Version, Connect-Timeout-Ms, Grpc-Status, Grpc-Message, Grpc-Status-Details-Bin, Content-Encoding, Content-Disposition, Location"

// tokenExempt lists the routes that do their own auth (or need none).
func tokenExempt(r *http.Request) bool {
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/health":
		return true
	case (r.Method == http.MethodGet || r.Method == http.MethodPost) && r.URL.Path == "/files":
		return true
	case r.Method == http.MethodPost && r.URL.Path == "/init":
		return true
	}
	return false
}

func (a *Agent) currentToken() string {
	a.mu.RLock()
	defer a.mu.RUnlock()
	return a.token
}

func tokenEqual(a, b string) bool {
	return subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// ValidToken reports whether got is the agent's current token. An agent
// without a token accepts none: it fails closed.
func (a *Agent) ValidToken(got string) bool {
	tok := a.currentToken()
	return tok != "" && tokenEqual(got, tok)
}

func (a *Agent) tokenMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !tokenExempt(r) && !a.ValidToken(r.Header.Get("X-Access-Token")) {
			writeJSONError(w, http.StatusUnauthorized, "invalid access token")
			return
		}
		next.ServeHTTP(w, r)
	})
}

type ctxKey int

const userKey ctxKey = 0

// userMiddleware resolves the Basic-auth user (password ignored, as in envd).
func (a *Agent) userMiddleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if h := r.Header.Get("Authorization"); h != "" {
			name, ok := parseBasicUser(h)
			if !ok {
				writeJSONError(w, http.StatusUnauthorized, "invalid authorization header")
				return
			}
			u, err := a.lookupUser(name)
			if err != nil {
				writeJSONError(w, http.StatusUnauthorized, "invalid user: "+name)
				return
			}
			r = r.WithContext(withUser(r.Context(), u))
		}
		next.ServeHTTP(w, r)
	})
}

func parseBasicUser(h string) (string, bool) {
	const prefix = "Basic "
	if len(h) < len(prefix) || !strings.EqualFold(h[:len(prefix)], prefix) {
		return "", false
	}
	raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(h[len(prefix):]))
	if err != nil {
		return "", false
	}
	name, _, _ := strings.Cut(string(raw), ":")
	return name, name != ""
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"code": status, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
