package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// A 500's body must not carry the internal error's text; the log must, with
// the same error ID the client sees.
func TestFail500HidesInternalText(t *testing.T) {
	var logBuf bytes.Buffer
	s := &Server{cfg: Config{RetryAfterSeconds: 1}, log: slog.New(slog.NewTextHandler(&logBuf, nil))}
	secret := "open /var/lib/cubicle/secret.db: disk I/O error"
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/sandboxes/x", nil)
	s.fail(rec, req, fmt.Errorf("lookup: %w", errors.New(secret)))

	if rec.Code != http.StatusInternalServerError {
		t.Fatalf("status %d", rec.Code)
	}
	body := rec.Body.String()
	if strings.Contains(body, "secret.db") || strings.Contains(body, "disk I/O") || strings.Contains(body, "lookup") {
		t.Fatalf("500 body leaks internal text: %s", body)
	}
	var eb errorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil {
		t.Fatal(err)
	}
	id := rec.Header().Get("X-Error-Id")
	if eb.Code != 500 || id == "" || !strings.Contains(eb.Message, id) {
		t.Fatalf("body %+v, error id %q", eb, id)
	}
	if !strings.Contains(logBuf.String(), "secret.db") || !strings.Contains(logBuf.String(), id) {
		t.Fatalf("log lacks the error or its id: %s", logBuf.String())
	}
}

// A snapshot refused for its size is a 507 whose body says why, in e2b's
// shape, never a 500 with an error ID.
func TestFailSnapshotTooLarge(t *testing.T) {
	s := &Server{cfg: Config{RetryAfterSeconds: 1}, log: slog.New(slog.DiscardHandler)}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodPost, "/sandboxes/x/snapshots", nil)
	s.fail(rec, req, fmt.Errorf("sandbox 'x': %w: its files take more than 1073741824 bytes, the sandbox's disk size; nothing was kept", runtime.ErrSnapshotTooLarge))
	var eb errorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil {
		t.Fatal(err)
	}
	if rec.Code != http.StatusInsufficientStorage || eb.Code != 507 || !strings.Contains(eb.Message, "the sandbox's disk size") || eb.ErrorCode != "snapshot_too_large" {
		t.Fatalf("status %d body %+v", rec.Code, eb)
	}
}

// Upload URLs that were handed out and never used go on the collector's
// pass, not only when another grant happens.
func TestPruneUploads(t *testing.T) {
	s := &Server{}
	live := s.uploads.grant("team", "h1")
	s.uploads.mu.Lock()
	s.uploads.tokens["stale"] = uploadGrant{team: "team", hash: "h2", expires: time.Now().Add(-time.Minute)}
	s.uploads.mu.Unlock()
	s.PruneUploads()
	s.uploads.mu.Lock()
	defer s.uploads.mu.Unlock()
	if _, ok := s.uploads.tokens["stale"]; ok || len(s.uploads.tokens) != 1 {
		t.Fatalf("after prune: %v", s.uploads.tokens)
	}
	if _, ok := s.uploads.tokens[live]; !ok {
		t.Fatal("live grant pruned")
	}
}
