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

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
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

// A scheduler refusal answers as capacity (429 with Retry-After, so SDKs
// retry), unless every node refused the accelerator request as
// incompatible: then 400 naming the layer, as on one node.
func TestFailNoFitIsCapacityOrTheAcceleratorLayer(t *testing.T) {
	s := &Server{cfg: Config{RetryAfterSeconds: 1}, log: slog.New(slog.DiscardHandler)}
	sch, err := scheduler.New(scheduler.Config{})
	if err != nil {
		t.Fatal(err)
	}
	small := scheduler.Node{ID: "n1", Capacity: scheduler.Resources{MilliCPU: 1000, MemoryMiB: 512, DiskMiB: 1024}}
	_, errFull := sch.Place(&scheduler.Request{Resources: scheduler.Resources{MilliCPU: 1000, MemoryMiB: 1024}}, []scheduler.Node{small})
	_, errAccel := sch.Place(&scheduler.Request{Accelerator: &accel.Request{Class: accel.ClassGPU, Count: 1}}, []scheduler.Node{small})
	for _, c := range []struct {
		err    error
		status int
		code   string
		msg    string
	}{
		{errFull, http.StatusTooManyRequests, "sandbox_capacity_unavailable", "1 node lacks memory (need 1024 MiB, most free 512 MiB)"},
		{errAccel, http.StatusBadRequest, "sandbox_no_compatible_node", "accelerator compatibility (hardware, at scheduling)"},
	} {
		rec := httptest.NewRecorder()
		s.fail(rec, httptest.NewRequest(http.MethodPost, "/sandboxes", nil), fmt.Errorf("create: %w", c.err))
		var eb errorBody
		if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil {
			t.Fatal(err)
		}
		if rec.Code != c.status || eb.Code != c.status || eb.ErrorCode != c.code || !strings.Contains(eb.Message, c.msg) {
			t.Fatalf("%v: status %d body %+v", c.err, rec.Code, eb)
		}
		if (c.status == http.StatusTooManyRequests) != (rec.Header().Get("Retry-After") != "") {
			t.Fatalf("%v: Retry-After %q", c.err, rec.Header().Get("Retry-After"))
		}
	}
}
