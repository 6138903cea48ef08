// Package api serves the e2b-compatible control-plane REST API.
package api

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/diskbudget"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template/catalog"
	"github.com/cubicle-dev/cubicle/internal/volume"
)

// errorBody is e2b's error shape; code always equals the HTTP status because
// the JS SDK branches on the body's code.
type errorBody struct {
	Code    int    `json:"code"`
	Message string `json:"message"`
	// ErrorCode is infra's semantic code; clients (the Go SDK) branch on
	// it rather than on message text.
	ErrorCode string `json:"error_code,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, errorBody{Code: status, Message: msg})
}

// statusOf maps typed control-plane errors to HTTP statuses.
func statusOf(err error) int {
	if st, ok := secretStatus(err); ok {
		return st
	}
	switch {
	case errors.Is(err, control.ErrNotFound), errors.Is(err, control.ErrTemplateNotFound), errors.Is(err, control.ErrVolumeNotFound),
		errors.Is(err, control.ErrSnapshotNotFound), errors.Is(err, catalog.ErrNotFound), errors.Is(err, catalog.ErrBuildNotFound):
		return http.StatusNotFound
	case errors.Is(err, catalog.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, catalog.ErrForbidden), errors.Is(err, control.ErrForbidden):
		return http.StatusForbidden
	case errors.Is(err, store.ErrQuota):
		return http.StatusTooManyRequests
	case errors.Is(err, catalog.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, catalog.ErrNotImplemented):
		return http.StatusNotImplemented
	case errors.Is(err, control.ErrInvalid), errors.Is(err, scheduler.ErrInvalid), errors.Is(err, network.ErrInvalidPolicy), errors.Is(err, volume.ErrUnknownDriver),
		errors.Is(err, node.ErrVolumeDriver), errors.Is(err, accel.ErrIncompatible), errors.Is(err, accel.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, control.ErrUnauthorized):
		return http.StatusUnauthorized
	case errors.Is(err, control.ErrConflict), errors.Is(err, control.ErrVolumeInUse), errors.Is(err, node.ErrSnapshotUnsupported):
		return http.StatusConflict
	case errors.Is(err, volume.ErrPluginTimeout):
		// A volume plugin (the upstream of this request) did not answer in time.
		return http.StatusGatewayTimeout
	case errors.Is(err, volume.ErrPlugin), errors.Is(err, volume.ErrProtocol):
		return http.StatusBadGateway
	case errors.Is(err, accel.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, accel.ErrBusy), errors.Is(err, accel.ErrIllegalTransition):
		return http.StatusConflict
	case errors.Is(err, control.ErrCapacity), errors.Is(err, accel.ErrNoCapacity), errors.Is(err, scheduler.ErrNoFit):
		return http.StatusTooManyRequests
	case errors.Is(err, runtime.ErrSnapshotTooLarge):
		// The sandbox's files do not fit the storage it is allowed.
		return http.StatusInsufficientStorage
	case errors.Is(err, control.ErrBusy), errors.Is(err, network.ErrPoolExhausted):
		return http.StatusServiceUnavailable
	case errors.Is(err, diskbudget.ErrInsufficientStorage):
		return http.StatusInsufficientStorage
	case errors.Is(err, control.ErrVolumeUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, errdefs.ErrUnavailable):
		// A node (or a sandbox's agent) that cannot be reached now: the
		// client may try again (Retry-After), a create on another node.
		return http.StatusServiceUnavailable
	default:
		return http.StatusInternalServerError
	}
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, err error) {
	st := statusOf(err)
	switch st {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable:
		// The JS SDK (2.49.1+) retries a 429 only when Retry-After is present.
		w.Header().Set("Retry-After", strconv.Itoa(s.cfg.RetryAfterSeconds))
	case http.StatusBadGateway, http.StatusGatewayTimeout:
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	case http.StatusInternalServerError:
		// An untyped error's text names internals (paths, SQL, node
		// addresses): the client gets an ID to quote, the log the detail.
		id := newErrorID()
		s.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "error_id", id, "err", err)
		w.Header().Set("X-Error-Id", id)
		writeJSON(w, st, errorBody{Code: st, Message: "internal error (error id " + id + ")", ErrorCode: errorCode(err)})
		return
	}
	msg := err.Error()
	var qe *store.QuotaError
	if errors.As(err, &qe) {
		// "team quota exceeded: concurrent sandboxes (10)", whatever wrapped it.
		msg = qe.Error()
	}
	writeJSON(w, st, errorBody{Code: st, Message: msg, ErrorCode: errorCode(err)})
}

// errorCode names the typed errors clients need to tell apart within one
// status (a 404 for a template vs a volume, a 409 for a volume in use).
func errorCode(err error) string {
	switch {
	case errors.Is(err, control.ErrVolumeInUse):
		return "volume_in_use"
	case errors.Is(err, control.ErrVolumeNotFound):
		return "volume_not_found"
	case errors.Is(err, secret.ErrNotFound):
		return "secret_not_found"
	case errors.Is(err, control.ErrTemplateNotFound), errors.Is(err, catalog.ErrNotFound):
		return "template_not_found"
	case errors.Is(err, catalog.ErrBuildNotFound):
		return "build_not_found"
	case errors.Is(err, control.ErrSnapshotNotFound):
		return "snapshot_not_found"
	case errors.Is(err, control.ErrNotFound):
		return "sandbox_not_found"
	case errors.Is(err, accel.ErrIncompatible):
		return "sandbox_no_compatible_node"
	case errors.Is(err, control.ErrCapacity), errors.Is(err, accel.ErrNoCapacity), errors.Is(err, scheduler.ErrNoFit):
		return "sandbox_capacity_unavailable"
	case errors.Is(err, store.ErrQuota):
		return "team_quota_exceeded"
	case errors.Is(err, control.ErrAccelUnsupported):
		return "accelerator_unsupported"
	case errors.Is(err, diskbudget.ErrInsufficientStorage):
		return "insufficient_storage"
	case errors.Is(err, runtime.ErrSnapshotTooLarge):
		return "snapshot_too_large"
	}
	return ""
}

// newErrorID names one 500 so a client's report can be matched to the log.
func newErrorID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24+)
	return hex.EncodeToString(b)
}
