package api

import (
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// snapshotJSON is e2b's SnapshotInfo plus what Cubicle knows of it.
type snapshotJSON struct {
	SnapshotID string    `json:"snapshotID"`
	Names      []string  `json:"names"`
	SandboxID  string    `json:"sandboxID"`
	TemplateID string    `json:"templateID"`
	Kind       string    `json:"kind"`
	SizeBytes  int64     `json:"sizeBytes"`
	CreatedAt  time.Time `json:"createdAt"`
}

func snapshotResponse(in *control.SnapshotInfo) snapshotJSON {
	names := in.Names
	if names == nil {
		names = []string{}
	}
	return snapshotJSON{SnapshotID: in.ID, Names: names, SandboxID: in.SandboxID, TemplateID: in.SourceTemplateID,
		Kind: in.Kind, SizeBytes: in.SizeBytes, CreatedAt: in.CreatedAt}
}

func (s *Server) createSnapshot(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name *string `json:"name"`
	}
	if !s.decode(w, r, &req, true) {
		return
	}
	name := ""
	if req.Name != nil {
		name = *req.Name
	}
	info, err := s.mgr.Snapshot(r.Context(), chi.URLParam(r, "id"), name)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusCreated, snapshotResponse(info))
}

func (s *Server) getSnapshot(w http.ResponseWriter, r *http.Request) {
	info, err := s.mgr.GetSnapshot(r.Context(), chi.URLParam(r, "snapshotID"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, snapshotResponse(info))
}

func (s *Server) deleteSnapshot(w http.ResponseWriter, r *http.Request) {
	if err := s.mgr.DeleteSnapshot(r.Context(), chi.URLParam(r, "snapshotID")); err != nil {
		s.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) listSnapshots(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := store.SnapshotFilter{SandboxID: q.Get("sandboxID")}
	var msg string
	if f.Limit, f.AfterCreated, f.AfterID, msg = pageQuery(q); msg != "" {
		writeError(w, http.StatusBadRequest, msg)
		return
	}
	page, err := s.mgr.ListSnapshots(r.Context(), f, q.Get("name"))
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]snapshotJSON, 0, len(page.Snapshots))
	for _, in := range page.Snapshots {
		out = append(out, snapshotResponse(in))
	}
	if page.More && len(page.Snapshots) > 0 {
		last := page.Snapshots[len(page.Snapshots)-1]
		w.Header().Set("X-Next-Token", base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(last.CreatedAt.UnixNano(), 10)+":"+last.ID)))
	}
	writeJSON(w, http.StatusOK, out)
}

// pageQuery reads the limit (1-100, default 100) and nextToken (a created
// time and ID cursor) that the snapshot and secret lists share, or returns
// the message of the 400 that refuses them.
func pageQuery(q url.Values) (limit int, afterCreated time.Time, afterID, msg string) {
	limit = 100
	if v := q.Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			return 0, time.Time{}, "", "limit must be an integer between 1 and 100"
		}
		limit = n
	}
	if tok := q.Get("nextToken"); tok != "" {
		var err error
		if afterCreated, afterID, err = decodeSnapshotCursor(tok); err != nil {
			return 0, time.Time{}, "", "invalid nextToken"
		}
	}
	return limit, afterCreated, afterID, ""
}

func decodeSnapshotCursor(tok string) (time.Time, string, error) {
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return time.Time{}, "", err
	}
	ns, id, ok := strings.Cut(string(b), ":")
	if !ok || id == "" {
		return time.Time{}, "", errors.New("malformed token")
	}
	n, err := strconv.ParseInt(ns, 10, 64)
	if err != nil {
		return time.Time{}, "", err
	}
	return time.Unix(0, n).UTC(), id, nil
}

// forkResult is e2b's SandboxForkResult: exactly one of the two is set.
type forkResult struct {
	Sandbox *sandboxJSON `json:"sandbox,omitempty"`
	Error   *errorBody   `json:"error,omitempty"`
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Count   *int   `json:"count"`
		Timeout *int64 `json:"timeout"`
	}
	if !s.decode(w, r, &req, true) {
		return
	}
	count := 1
	if req.Count != nil {
		count = *req.Count
	}
	timeout := control.DefaultForkTimeout
	if req.Timeout != nil {
		d, msg := timeoutDuration(*req.Timeout)
		if msg != "" {
			writeError(w, http.StatusBadRequest, msg)
			return
		}
		timeout = d
	}
	o := control.CreateOptions{}
	if k := apiKeyOf(r); k != nil {
		o.APIKeyID = k.ID
	}
	res, err := s.mgr.Fork(r.Context(), chi.URLParam(r, "id"), count, timeout, o)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	out := make([]forkResult, len(res))
	for i, fr := range res {
		if fr.Err != nil {
			st := statusOf(fr.Err)
			msg := fr.Err.Error()
			if st == http.StatusInternalServerError {
				msg = "fork failed to start" // internals stay in the log
				s.log.Error("fork", "sandbox", chi.URLParam(r, "id"), "err", fr.Err)
			}
			out[i].Error = &errorBody{Code: st, Message: msg}
			continue
		}
		sj := s.sandboxResponse(fr.Sandbox)
		out[i].Sandbox = &sj
	}
	writeJSON(w, http.StatusCreated, out)
}

func (s *Server) rollback(w http.ResponseWriter, r *http.Request) {
	var req struct {
		SnapshotID string `json:"snapshotID"`
	}
	if !s.decode(w, r, &req, false) {
		return
	}
	if req.SnapshotID == "" {
		writeError(w, http.StatusBadRequest, "snapshotID is required")
		return
	}
	id := chi.URLParam(r, "id")
	kind, err := s.mgr.RollbackKind(r.Context(), id, req.SnapshotID)
	if err != nil {
		s.fail(w, r, err)
		return
	}
	// kind tells the caller what came back: "memory" (processes and their
	// state, runsc) or "filesystem" (the files; the sandbox rebooted on them,
	// runc, which cannot checkpoint memory here). CubeSandbox's client hands
	// this body to its caller as it is.
	writeJSON(w, http.StatusOK, map[string]string{"sandboxID": id, "snapshotID": req.SnapshotID, "status": "success", "kind": kind})
}
