package api

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// secretJSON is e2b's Secret. It has no value field: values are write-only.
type secretJSON struct {
	SecretID       string            `json:"secretID"`
	Name           string            `json:"name"`
	CurrentVersion int               `json:"currentVersion"`
	Metadata       map[string]string `json:"metadata"`
	CreatedAt      time.Time         `json:"createdAt"`
	UpdatedAt      time.Time         `json:"updatedAt"`
}

type newSecret struct {
	Name     *string           `json:"name"`
	Value    *string           `json:"value"`
	Metadata map[string]string `json:"metadata"`
}

type secretUpdate struct {
	Value *string `json:"value"`
	// Metadata replaces the stored metadata when present; absent keeps it.
	Metadata map[string]string `json:"metadata"`
}

func secretOut(s *store.Secret) secretJSON {
	m := s.Metadata
	if m == nil {
		m = map[string]string{}
	}
	return secretJSON{SecretID: s.ID, Name: s.Name, CurrentVersion: s.Version, Metadata: m, CreatedAt: s.CreatedAt, UpdatedAt: s.UpdatedAt}
}

func (s *Server) secretRoutes(r chi.Router) {
	r.Post("/secrets", s.createSecret)
	r.Get("/secrets", s.listSecrets)
	r.Get("/secrets/{secret}", s.getSecret)
	r.Post("/secrets/{secret}", s.updateSecret)
	r.Delete("/secrets/{secret}", s.deleteSecret)
}

// secretRef is the {secret} path segment, percent-decoded. chi matches on
// r.URL.RawPath whenever the client's escaping differs from Go's default
// (the JS SDK's encodeURIComponent sends '/' as %2F, '+' as %2B), and its URL
// params are then still escaped; with RawPath empty they are already
// decoded. Without this a name holding such a character was never found.
func secretRef(w http.ResponseWriter, r *http.Request) (string, bool) {
	ref := chi.URLParam(r, "secret")
	if r.URL.RawPath == "" {
		return ref, true
	}
	ref, err := url.PathUnescape(ref)
	if err != nil {
		writeError(w, http.StatusBadRequest, "secret: malformed percent-encoding in the path")
		return "", false
	}
	return ref, true
}

func (s *Server) createSecret(w http.ResponseWriter, r *http.Request) {
	var req newSecret
	if !s.decodeSecretBody(w, r, &req) {
		return
	}
	switch {
	case req.Name == nil:
		writeError(w, http.StatusBadRequest, "name is required")
		return
	case req.Value == nil:
		writeError(w, http.StatusBadRequest, "value is required")
		return
	}
	sec, err := s.cfg.Secrets.Create(r.Context(), teamOf(r), *req.Name, *req.Value, req.Metadata)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, secretOut(sec))
}

func (s *Server) updateSecret(w http.ResponseWriter, r *http.Request) {
	var req secretUpdate
	if !s.decodeSecretBody(w, r, &req) {
		return
	}
	if req.Value == nil {
		writeError(w, http.StatusBadRequest, "value is required")
		return
	}
	ref, ok := secretRef(w, r)
	if !ok {
		return
	}
	sec, err := s.cfg.Secrets.Update(r.Context(), teamOf(r), ref, *req.Value, req.Metadata)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, secretOut(sec))
}

func (s *Server) getSecret(w http.ResponseWriter, r *http.Request) {
	ref, ok := secretRef(w, r)
	if !ok {
		return
	}
	sec, err := s.cfg.Secrets.Get(r.Context(), teamOf(r), ref)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, secretOut(sec))
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request) {
	ref, ok := secretRef(w, r)
	if !ok {
		return
	}
	if err := s.cfg.Secrets.Delete(r.Context(), teamOf(r), ref); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := store.SecretFilter{TeamID: teamOf(r)}
	var msg string
	// Same cursor shape as snapshots: created time and ID.
	if f.Limit, f.AfterCreated, f.AfterID, msg = pageQuery(q); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	want := f.Limit
	f.Limit++ // one extra row says whether there is a next page
	secs, err := s.cfg.Secrets.List(r.Context(), f)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	more := len(secs) > want
	if more {
		secs = secs[:want]
	}
	out := make([]secretJSON, 0, len(secs))
	for _, sec := range secs {
		out = append(out, secretOut(sec))
	}
	if more {
		last := secs[len(secs)-1]
		w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(last.CreatedAt.UnixNano(), 10)+":"+last.ID)))
	}
	writeJSON(w, http.StatusOK, out)
}

// secretStatus maps the secret package's typed errors (see statusOf).
func secretStatus(err error) (int, bool) {
	switch {
	case errors.Is(err, secret.ErrNotFound):
		return http.StatusNotFound, true
	case errors.Is(err, secret.ErrInvalid):
		return http.StatusBadRequest, true
	case errors.Is(err, secret.ErrConflict):
		return http.StatusConflict, true
	}
	return 0, false
}

// decodeSecretBody decodes strictly (an unknown field is refused by name)
// and, unlike decodeJSON, never puts any of the body into a message: a
// syntax error's text can quote the value being set.
func (s *Server) decodeSecretBody(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", s.cfg.MaxBodyBytes))
			return false
		}
		writeError(w, http.StatusBadRequest, "reading body failed")
		return false
	}
	if len(bytes.TrimSpace(body)) == 0 {
		writeError(w, http.StatusBadRequest, "request body is required")
		return false
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err = dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("trailing data")
	}
	if err == nil {
		return true
	}
	var te *json.UnmarshalTypeError
	var se *json.SyntaxError
	msg := "malformed JSON body"
	switch {
	case errors.As(err, &te):
		msg = fmt.Sprintf("%s must be a %s", te.Field, jsonKind(te.Type.Kind().String()))
	case errors.As(err, &se):
		msg = fmt.Sprintf("malformed JSON body at byte %d", se.Offset)
	default:
		// encoding/json has no typed error for an unknown field; its
		// message names only the field.
		if f, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			msg = "unknown field " + f
		}
	}
	writeError(w, http.StatusBadRequest, msg)
	return false
}

func jsonKind(k string) string {
	switch k {
	case "map":
		return "object of strings"
	case "ptr":
		return "string"
	}
	return k
}
