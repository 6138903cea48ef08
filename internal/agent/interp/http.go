package interp

import (
	"bytes"
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/agent/cors"
)

// maxBodyBytes bounds a request body (code included).
const maxBodyBytes = 16 << 20

// Handler serves e2b's code interpreter API:
//
//	GET    /health                  200 "OK" once the default python kernel is ready (Ready), 503 before
//	POST   /execute                 200, newline-delimited JSON stream
//	POST   /contexts                200 {"id","language","cwd"}
//	GET    /contexts                200 [{"id","language","cwd"}, ...]
//	DELETE /contexts/{id}           204
//	POST   /contexts/{id}/restart   204
//
// Errors are {"code": status, "message": text}. /execute needs the
// sandbox's access token in X-Access-Token, always (an agent without one
// refuses it); the context routes do not, since the SDKs send no token
// there (the proxy still guards the port).
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		status, msg := s.readiness()
		if status != http.StatusOK {
			writeJSONError(w, status, msg)
			return
		}
		writeJSON(w, status, msg)
	})
	mux.HandleFunc("POST /execute", s.handleExecute)
	mux.HandleFunc("POST /contexts", s.handleCreateContext)
	mux.HandleFunc("GET /contexts", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, s.Contexts())
	})
	mux.HandleFunc("DELETE /contexts/{id}", func(w http.ResponseWriter, r *http.Request) {
		if err := s.RemoveContext(r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	mux.HandleFunc("POST /contexts/{id}/restart", func(w http.ResponseWriter, r *http.Request) {
		if err := s.RestartContext(r.Context(), r.PathValue("id")); err != nil {
			writeError(w, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	})
	return cors.Handler(mux, "")
}

// readiness is GET /health's answer: 200 once Ready, 503 while the default
// kernel starts, 500 when Warm failed to start it (an execution on the
// default context tries again).
func (s *Server) readiness() (int, string) {
	select {
	case <-s.defReady:
		return http.StatusOK, "OK"
	default:
	}
	s.mu.Lock()
	err := s.warmErr
	s.mu.Unlock()
	if err != nil {
		return http.StatusInternalServerError, "the default kernel failed to start: " + strings.TrimPrefix(err.Error(), "interp: ")
	}
	return http.StatusServiceUnavailable, "the default kernel is starting"
}

// executeBody is POST /execute's body.
type executeBody struct {
	Code      *string           `json:"code"`
	ContextID string            `json:"context_id"`
	Language  string            `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

func (s *Server) handleExecute(w http.ResponseWriter, r *http.Request) {
	// Fails closed: an agent without a token accepts none.
	if tok := s.host.AccessToken(); tok == "" || subtle.ConstantTimeCompare([]byte(r.Header.Get("X-Access-Token")), []byte(tok)) != 1 {
		writeJSONError(w, http.StatusUnauthorized, "invalid access token")
		return
	}
	var body executeBody
	if !decodeBody(w, r, &body) {
		return
	}
	if body.Code == nil {
		writeJSONError(w, http.StatusBadRequest, "code is required")
		return
	}
	if body.ContextID != "" && body.Language != "" {
		writeJSONError(w, http.StatusBadRequest, "Only one of context_id or language can be provided")
		return
	}
	for k, v := range body.EnvVars {
		if !validEnvName(k) || strings.ContainsRune(v, 0) {
			writeJSONError(w, http.StatusBadRequest, fmt.Sprintf("invalid env var %q: names must be non-empty without '=' or NUL, values without NUL", k))
			return
		}
	}
	var c *codeContext
	var err error
	if body.ContextID != "" {
		c, err = s.lookup(body.ContextID)
	} else {
		c, err = s.defaultContext(r.Context(), body.Language)
	}
	if err != nil {
		writeError(w, err)
		return
	}
	h := w.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	_ = rc.Flush()
	emit := func(v any) error {
		b, err := json.Marshal(v)
		if err != nil {
			return err
		}
		if _, err := w.Write(append(b, '\n')); err != nil {
			return err
		}
		return rc.Flush()
	}
	s.execute(r.Context(), c, executeOptions{code: *body.Code, envVars: body.EnvVars}, emit)
}

// createBody is POST /contexts's body.
type createBody struct {
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

func (s *Server) handleCreateContext(w http.ResponseWriter, r *http.Request) {
	var body createBody
	if !decodeBody(w, r, &body) {
		return
	}
	c, err := s.CreateContext(r.Context(), body.Language, body.Cwd)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, c)
}

// decodeBody decodes a JSON object strictly: unknown fields are refused by
// name rather than ignored. An empty body is an empty object.
func decodeBody(w http.ResponseWriter, r *http.Request, v any) bool {
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBodyBytes))
	if err != nil {
		writeJSONError(w, http.StatusBadRequest, "read body: "+err.Error())
		return false
	}
	if len(bytes.TrimSpace(b)) == 0 {
		return true
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeJSONError(w, http.StatusBadRequest, "invalid body: "+err.Error())
		return false
	}
	return true
}

func writeError(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	// The package prefix means nothing to an SDK user.
	msg := strings.TrimPrefix(err.Error(), "interp: ")
	switch {
	case errors.Is(err, ErrContextNotFound):
		status = http.StatusNotFound
		msg = "Context " + strings.TrimPrefix(err.Error(), ErrContextNotFound.Error()+": ") + " not found"
	case errors.Is(err, ErrUnknownLanguage), errors.Is(err, ErrInvalidCwd):
		status = http.StatusBadRequest
	case errors.Is(err, ErrTooManyContexts):
		status = http.StatusTooManyRequests
	}
	writeJSONError(w, status, msg)
}

func writeJSONError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{"code": status, "message": msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
