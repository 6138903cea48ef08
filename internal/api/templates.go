package api

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/control"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/cubicle-dev/cubicle/internal/agentapi"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template/catalog"
)

// ContextStore holds uploaded build-context tars by team and filesHash: a
// hash one team uploaded is not present for another.
type ContextStore interface {
	Has(team, hash string) bool
	Put(team, hash string, body io.Reader) error
}

// Context store errors the upload route maps.
type ContextErrors struct {
	Conflict, TooLarge, BadArchive, UnsafePath, InvalidHash error
}

// Templates wires the template routes; nil Catalog disables them.
type Templates struct {
	Catalog  *catalog.Catalog
	Contexts ContextStore
	Errors   ContextErrors
	// InUse says why a template may not be deleted ("" = it may).
	InUse catalog.InUse
}

type templateJSON struct {
	TemplateID    string     `json:"templateID"`
	BuildID       string     `json:"buildID"`
	CPUCount      int        `json:"cpuCount"`
	MemoryMB      int        `json:"memoryMB"`
	DiskSizeMB    int        `json:"diskSizeMB"`
	Public        bool       `json:"public"`
	Aliases       []string   `json:"aliases"`
	Names         []string   `json:"names"`
	CreatedAt     time.Time  `json:"createdAt"`
	UpdatedAt     time.Time  `json:"updatedAt"`
	CreatedBy     *struct{}  `json:"createdBy"`
	LastSpawnedAt *time.Time `json:"lastSpawnedAt"`
	SpawnCount    int64      `json:"spawnCount"`
	BuildCount    int64      `json:"buildCount"`
	EnvdVersion   string     `json:"envdVersion"`
	BuildStatus   string     `json:"buildStatus"`
	// Status is the build status as CubeAPI words it (READY, BUILDING,
	// WAITING, FAILED): its clients read this field.
	Status   string `json:"status"`
	PoolSize int    `json:"poolSize"`
	// Accelerators is the compatibility contract (Cubicle extension).
	Accelerators *accel.Contract `json:"accelerators,omitempty"`
}

type buildJSON struct {
	BuildID     string     `json:"buildID"`
	Status      string     `json:"status"`
	CreatedAt   time.Time  `json:"createdAt"`
	UpdatedAt   time.Time  `json:"updatedAt"`
	FinishedAt  *time.Time `json:"finishedAt,omitempty"`
	CPUCount    int        `json:"cpuCount"`
	MemoryMB    int        `json:"memoryMB"`
	DiskSizeMB  int        `json:"diskSizeMB"`
	EnvdVersion string     `json:"envdVersion"`
}

func templateOut(t *store.Template) templateJSON {
	out := templateJSON{TemplateID: t.ID, BuildID: t.LatestBuildID, CPUCount: t.CPUCount, MemoryMB: t.MemoryMB, DiskSizeMB: t.DiskSizeMB,
		Public: t.Public, Aliases: append([]string{}, t.Names...), Names: append([]string{}, t.Names...), CreatedAt: t.CreatedAt, UpdatedAt: t.UpdatedAt,
		SpawnCount: t.SpawnCount, BuildCount: t.BuildCount, EnvdVersion: agentapi.EnvdVersion, BuildStatus: catalog.APIStatus(t.BuildStatus), Status: cubeStatus(t.BuildStatus), PoolSize: t.PoolSize}
	if t.ReadyBuildID != "" {
		out.BuildID = t.ReadyBuildID
	}
	out.Accelerators, _ = catalog.Contract(t)
	if !t.LastSpawnedAt.IsZero() {
		ls := t.LastSpawnedAt
		out.LastSpawnedAt = &ls
	}
	return out
}

func (s *Server) templateRoutes(r chi.Router) {
	r.Get("/templates", s.listTemplatesV1)
	r.Get("/v2/templates", s.listTemplatesV2)
	r.Post("/templates", s.createTemplate)
	r.Post("/v2/templates", s.createTemplate)
	r.Post("/v3/templates", s.createTemplate)
	r.Get("/templates/aliases/{alias}", s.templateAlias)
	r.Post("/templates/tags", s.assignTags)
	r.Delete("/templates/tags", s.removeTags)
	r.Get("/templates/{id}", s.getTemplate)
	r.Post("/templates/{id}", s.rebuildFromImage)
	r.Put("/templates/{id}/alias", s.setTemplateAlias)
	r.Delete("/templates/{id}", s.deleteTemplate)
	r.Patch("/templates/{id}", s.patchTemplate)
	r.Patch("/v2/templates/{id}", s.patchTemplate)
	r.Get("/templates/{id}/tags", s.listTags)
	r.Get("/templates/{id}/pool", s.getPool)
	r.Put("/templates/{id}/pool", s.setPool)
	r.Get("/templates/{id}/files/{hash}", s.templateFile)
	r.Post("/v2/templates/{id}/builds/{buildID}", s.startBuild)
	r.Get("/templates/{id}/builds/{buildID}/status", s.buildStatus)
	r.Get("/templates/{id}/builds/{buildID}/logs", s.buildLogs)
}

func (s *Server) catalog(w http.ResponseWriter) *catalog.Catalog {
	if s.cfg.Templates == nil || s.cfg.Templates.Catalog == nil {
		writeError(w, http.StatusNotImplemented, "templates are not enabled on this server")
		return nil
	}
	return s.cfg.Templates.Catalog
}

const maxV1Templates = 5000

func (s *Server) listTemplatesV1(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	ts, err := c.List(r.Context(), callerOf(r), "", maxV1Templates+1)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(ts) > maxV1Templates {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("more than %d templates; use GET /v2/templates", maxV1Templates))
		return
	}
	out := make([]templateJSON, 0, len(ts))
	for _, t := range ts {
		out = append(out, templateOut(t))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) listTemplatesV2(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	limit := 100
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			writeError(w, http.StatusBadRequest, "limit must be between 1 and 100")
			return
		}
		limit = n
	}
	ts, err := c.List(r.Context(), callerOf(r), r.URL.Query().Get("nextToken"), limit+1)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	if len(ts) > limit {
		ts = ts[:limit]
		w.Header().Set("X-Next-Token", ts[limit-1].ID)
	}
	out := make([]templateJSON, 0, len(ts))
	for _, t := range ts {
		out = append(out, templateOut(t))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) createTemplate(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "request body too large")
		return
	}
	if isImageRequest(body) {
		s.createFromImage(w, r, c, body)
		return
	}
	var req catalog.CreateRequest
	if msg := decodeStrict(body, &req); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	resp, err := c.Create(r.Context(), callerOf(r), req, r.Header.Get("Idempotency-Key"), body)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusAccepted, resp)
}

func (s *Server) templateAlias(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	alias := chi.URLParam(r, "alias")
	t, err := c.Get(r.Context(), callerOf(r), alias)
	if name, _, _ := strings.Cut(alias, ":"); errors.Is(err, catalog.ErrNotFound) && (!catalog.ValidName(name) || catalog.ReservedName(name)) {
		// A name no template can have, or one of CubeAPI's ID prefixes
		// that names nothing: a malformed request, as CubeAPI answers
		// it, not "not found". (Looked up first: an e2b name with such a
		// prefix, or a longer one an earlier version accepted, resolves.)
		writeError(w, http.StatusBadRequest, fmt.Sprintf("alias %q is not a valid template name (lowercase letters, digits, '.', '_' and '-', at most 64, not starting with tpl- or snap-)", alias))
		return
	}
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, templateOut(t))
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	t, err := c.Get(r.Context(), callerOf(r), chi.URLParam(r, "id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	builds, err := c.Builds(r.Context(), t.ID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := struct {
		templateJSON
		Builds []buildJSON `json:"builds"`
		cubeTemplateJSON
	}{templateJSON: templateOut(t), Builds: []buildJSON{}}
	if out.cubeTemplateJSON, err = s.cubeDetail(r, c, t, builds); err != nil {
		s.fail(w, r, err)
		return
	}
	for _, b := range builds {
		bj := buildJSON{BuildID: b.ID, Status: catalog.APIStatus(b.Status), CreatedAt: b.CreatedAt, UpdatedAt: b.UpdatedAt,
			CPUCount: b.CPUCount, MemoryMB: b.MemoryMB, DiskSizeMB: b.DiskSizeMB, EnvdVersion: agentapi.EnvdVersion}
		if !b.FinishedAt.IsZero() {
			f := b.FinishedAt
			bj.FinishedAt = &f
		}
		out.Builds = append(out.Builds, bj)
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	if id := chi.URLParam(r, "id"); s.mgr.IsSnapshot(r.Context(), id) {
		// A snapshot's template: deleting it deletes the snapshot (its
		// files stay while sandboxes run on them).
		if err := s.mgr.DeleteSnapshot(r.Context(), id); err != nil {
			if errors.Is(err, control.ErrSnapshotNotFound) {
				// On this route a snapshot is a template (CubeSandbox's
				// SDK tells the two 404s apart by that word).
				err = fmt.Errorf("%w: template '%s' not found", control.ErrTemplateNotFound, id)
			}
			s.fail(w, r, err)
			return
		}
		w.WriteHeader(http.StatusNoContent)
		return
	}
	force, _ := strconv.ParseBool(r.URL.Query().Get("force"))
	if err := c.Delete(r.Context(), callerOf(r), chi.URLParam(r, "id"), force, s.cfg.Templates.InUse); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) patchTemplate(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	var req struct {
		Public *bool `json:"public"`
		// Accelerators (Cubicle extension) replaces the template's
		// compatibility contract; null clears it.
		Accelerators json.RawMessage `json:"accelerators"`
	}
	if !s.decode(w, r, &req, false) {
		return
	}
	if req.Public == nil && req.Accelerators == nil {
		writeError(w, http.StatusBadRequest, "public is required")
		return
	}
	id := chi.URLParam(r, "id")
	var t *store.Template
	var err error
	if req.Accelerators != nil {
		var ct *accel.Contract
		if err := json.Unmarshal(req.Accelerators, &ct); err != nil {
			writeError(w, http.StatusBadRequest, "accelerators: "+err.Error())
			return
		}
		if t, err = c.SetAccelerators(r.Context(), callerOf(r), id, ct); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	if req.Public != nil {
		if t, err = c.SetPublic(r.Context(), callerOf(r), id, *req.Public); err != nil {
			s.fail(w, r, err)
			return
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"names": t.Names})
}

func (s *Server) listTags(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	tags, err := c.Tags(r.Context(), callerOf(r), chi.URLParam(r, "id"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	type tagJSON struct {
		Tag       string    `json:"tag"`
		BuildID   string    `json:"buildID"`
		CreatedAt time.Time `json:"createdAt"`
	}
	out := []tagJSON{}
	for _, t := range tags {
		out = append(out, tagJSON{Tag: t.Tag, BuildID: t.BuildID, CreatedAt: t.CreatedAt})
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) assignTags(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	var req struct {
		Target string   `json:"target"`
		Tags   []string `json:"tags"`
	}
	if !s.decode(w, r, &req, false) {
		return
	}
	buildID, err := c.AssignTags(r.Context(), callerOf(r), req.Target, req.Tags)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"tags": req.Tags, "buildID": buildID})
}

func (s *Server) removeTags(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	var req struct {
		Name string   `json:"name"`
		Tags []string `json:"tags"`
	}
	if !s.decode(w, r, &req, false) {
		return
	}
	if err := c.RemoveTags(r.Context(), callerOf(r), req.Name, req.Tags); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// uploads hands out one-time upload URLs: the SDK PUTs without an API key,
// so the URL itself carries the authorisation. A token is spent by the
// first PUT that presents it, whatever that PUT's outcome (a failed upload
// asks GET /templates/{id}/files/{hash} for a new URL, as the SDK's retry
// of the build does), so a URL seen in a log or a proxy is worth nothing
// once used. Grants live in memory only: a restart voids every URL, which
// fails closed.
type uploads struct {
	mu     sync.Mutex
	tokens map[string]uploadGrant
}

type uploadGrant struct {
	team, hash string
	expires    time.Time
}

func (u *uploads) grant(team, hash string) string {
	b := make([]byte, 16)
	rand.Read(b)
	tok := hex.EncodeToString(b)
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.tokens == nil {
		u.tokens = map[string]uploadGrant{}
	}
	now := time.Now()
	u.pruneLocked(now)
	u.tokens[tok] = uploadGrant{team: team, hash: hash, expires: now.Add(time.Hour)}
	return tok
}

func (u *uploads) pruneLocked(now time.Time) {
	for k, g := range u.tokens {
		if now.After(g.expires) {
			delete(u.tokens, k)
		}
	}
}

// PruneUploads drops expired upload grants (URLs handed out and never
// used); the collector calls it, so they go even when no new grant does.
func (s *Server) PruneUploads() {
	s.uploads.mu.Lock()
	defer s.uploads.mu.Unlock()
	s.uploads.pruneLocked(time.Now())
}

// take spends the upload token and returns the team it was issued to. A
// token presented for another hash is not spent: it stays the owner's.
func (u *uploads) take(tok, hash string) (string, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	g, ok := u.tokens[tok]
	if !ok || g.hash != hash || !time.Now().Before(g.expires) {
		return "", false
	}
	delete(u.tokens, tok)
	return g.team, true
}

func (s *Server) baseURL(r *http.Request) string {
	scheme := "http"
	if r.TLS != nil || strings.EqualFold(r.Header.Get("X-Forwarded-Proto"), "https") {
		scheme = "https"
	}
	return scheme + "://" + r.Host
}

func (s *Server) templateFile(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	id, hash := chi.URLParam(r, "id"), chi.URLParam(r, "hash")
	if !validHash(hash) {
		writeError(w, http.StatusBadRequest, "hash must be 64 lowercase hex characters")
		return
	}
	// Contexts are uploaded for a build of a template the key may change.
	if _, err := c.Writable(r.Context(), callerOf(r), id); err != nil {
		s.fail(w, r, err)
		return
	}
	team := teamOf(r)
	present := s.cfg.Templates.Contexts.Has(team, hash)
	resp := map[string]any{"present": present, "headers": map[string]string{}}
	if !present {
		resp["url"] = fmt.Sprintf("%s/template-uploads/%s?token=%s", s.baseURL(r), hash, s.uploads.grant(team, hash))
	}
	writeJSON(w, http.StatusCreated, resp)
}

func validHash(h string) bool {
	if len(h) != 64 {
		return false
	}
	for _, c := range h {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// uploadContext is the PUT target of the URL templateFile returned.
func (s *Server) uploadContext(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Templates == nil || s.cfg.Templates.Contexts == nil {
		writeError(w, http.StatusNotImplemented, "templates are not enabled on this server")
		return
	}
	hash := chi.URLParam(r, "hash")
	team, ok := s.uploads.take(r.URL.Query().Get("token"), hash)
	if !ok {
		writeError(w, http.StatusUnauthorized, "invalid, expired or already used upload URL (each is good for one upload); ask GET /templates/{id}/files/{hash} for a new one")
		return
	}
	te := s.cfg.Templates.Errors
	err := s.cfg.Templates.Contexts.Put(team, hash, r.Body)
	switch {
	case err == nil:
		w.WriteHeader(http.StatusCreated)
	case te.Conflict != nil && errors.Is(err, te.Conflict):
		writeError(w, http.StatusConflict, err.Error())
	case te.TooLarge != nil && errors.Is(err, te.TooLarge):
		writeError(w, http.StatusRequestEntityTooLarge, err.Error())
	case (te.BadArchive != nil && errors.Is(err, te.BadArchive)) || (te.UnsafePath != nil && errors.Is(err, te.UnsafePath)) ||
		(te.InvalidHash != nil && errors.Is(err, te.InvalidHash)):
		writeError(w, http.StatusBadRequest, err.Error())
	default:
		s.fail(w, r, err)
	}
}

func (s *Server) startBuild(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	var req catalog.StartRequest
	if !s.decode(w, r, &req, false) {
		return
	}
	if err := c.StartBuild(r.Context(), callerOf(r), chi.URLParam(r, "id"), chi.URLParam(r, "buildID"), req); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusAccepted)
}

func (s *Server) buildStatus(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	q := r.URL.Query()
	offset, limit := 0, 100
	if v := q.Get("logsOffset"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			writeError(w, http.StatusBadRequest, "logsOffset must be a non-negative integer")
			return
		}
		offset = n
	}
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > 100 {
			writeError(w, http.StatusBadRequest, "limit must be between 0 and 100")
			return
		}
		if n > 0 {
			limit = n
		}
	}
	st, err := c.BuildStatus(r.Context(), callerOf(r), chi.URLParam(r, "id"), chi.URLParam(r, "buildID"), offset, limit, q.Get("level"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func (s *Server) buildLogs(w http.ResponseWriter, r *http.Request) {
	c := s.catalog(w)
	if c == nil {
		return
	}
	q := r.URL.Query()
	var cursor time.Time
	if v := q.Get("cursor"); v != "" {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "cursor must be a unix time in milliseconds")
			return
		}
		cursor = time.UnixMilli(ms)
	}
	limit := 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			writeError(w, http.StatusBadRequest, "limit must be between 1 and 100")
			return
		}
		limit = n
	}
	dir := q.Get("direction")
	if dir != "" && dir != "forward" && dir != "backward" {
		writeError(w, http.StatusBadRequest, "direction must be forward or backward")
		return
	}
	logs, err := c.BuildLogs(r.Context(), callerOf(r), chi.URLParam(r, "id"), chi.URLParam(r, "buildID"), cursor, limit, dir == "backward", q.Get("level"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"logs": logs})
}
