package cubicle

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
)

// Sentinel errors. Every error a call returns for an HTTP or RPC failure
// matches exactly the sentinels that describe it, via errors.Is.
var (
	// ErrNotFound matches every 404 (and the more specific *NotFound below).
	ErrNotFound = errors.New("cubicle: not found")
	// ErrSandboxNotFound: the sandbox does not exist (or is gone).
	ErrSandboxNotFound = errors.New("cubicle: sandbox not found")
	// ErrTemplateNotFound: no template has that ID or name.
	ErrTemplateNotFound = errors.New("cubicle: template not found")
	// ErrSnapshotNotFound: no snapshot has that ID or name (or it was deleted).
	ErrSnapshotNotFound = errors.New("cubicle: snapshot not found")
	// ErrVolumeNotFound: no volume has that ID or name.
	ErrVolumeNotFound = errors.New("cubicle: volume not found")
	// ErrSecretNotFound: no secret of the team has that ID or name.
	ErrSecretNotFound = errors.New("cubicle: secret not found")
	// ErrFileNotFound: a path inside a sandbox or volume does not exist.
	ErrFileNotFound = errors.New("cubicle: file not found")
	// ErrVolumeInUse: the volume is attached to a sandbox and cannot be deleted.
	ErrVolumeInUse = errors.New("cubicle: volume in use")
	// ErrUnauthorized: missing or wrong API key or access token (401).
	ErrUnauthorized = errors.New("cubicle: unauthorized")
	// ErrForbidden: authenticated but not allowed (403).
	ErrForbidden = errors.New("cubicle: forbidden")
	// ErrInvalidArgument: the server rejected the request as malformed (400).
	ErrInvalidArgument = errors.New("cubicle: invalid argument")
	// ErrConflict: the object is in a state that forbids the call (409),
	// e.g. pausing a paused sandbox or a GPU sandbox.
	ErrConflict = errors.New("cubicle: conflict")
	// ErrAlreadyExists: MakeDir of an existing directory and the like.
	ErrAlreadyExists = errors.New("cubicle: already exists")
	// ErrRateLimited: no capacity now or too many requests (429), after retries.
	ErrRateLimited = errors.New("cubicle: rate limited")
	// ErrServiceBusy: the server is overloaded (503), after retries.
	ErrServiceBusy = errors.New("cubicle: service busy")
	// ErrNotEnoughSpace: the sandbox disk is full (507).
	ErrNotEnoughSpace = errors.New("cubicle: not enough space")
	// ErrTimeout: the server, proxy or command deadline expired (504, or an
	// RPC deadline_exceeded).
	ErrTimeout = errors.New("cubicle: timeout")
	// ErrMissingAPIKey: NewClient was given no API key.
	ErrMissingAPIKey = fmt.Errorf("%w: no API key (set CUBICLE_API_KEY or E2B_API_KEY)", ErrUnauthorized)
)

// resource names what a call was about, so a 404 becomes the right
// specific sentinel.
type resource int

const (
	resNone resource = iota
	resSandbox
	resTemplate
	resSnapshot
	resVolume
	resFile
	resSecret
)

// APIError is a non-2xx answer from the control plane, envd or the
// volume-content API. The body is e2b's {"code": <status>, "message": ...},
// optionally with a semantic error_code.
type APIError struct {
	StatusCode int    // HTTP status
	Code       int    // the body's code (equal to StatusCode on Cubicle)
	ErrorCode  string // semantic code, e.g. "volume_in_use", when the server gives one
	Message    string
	Method     string
	Path       string
	// RetryAfter is the server's Retry-After hint, 0 when absent.
	RetryAfter time.Duration
	res        resource
}

// Error implements error.
func (e *APIError) Error() string {
	return fmt.Sprintf("%s %s: %d: %s", e.Method, e.Path, e.StatusCode, e.Message)
}

// status is the code the SDKs branch on: the body's, else the HTTP one.
func (e *APIError) status() int {
	if e.Code >= 400 && e.Code <= 599 {
		return e.Code
	}
	return e.StatusCode
}

// Is maps the error onto the sentinels by status, body code and the
// resource the call was about.
func (e *APIError) Is(target error) bool {
	st := e.status()
	// A semantic error_code from the server decides; without one the
	// resource the call was about does.
	specific := func(status int, code string, res resource) bool {
		if st != status {
			return false
		}
		if e.ErrorCode != "" {
			return e.ErrorCode == code
		}
		return e.res == res
	}
	switch target {
	case ErrNotFound:
		return st == http.StatusNotFound
	case ErrSandboxNotFound:
		return specific(http.StatusNotFound, "sandbox_not_found", resSandbox)
	case ErrTemplateNotFound:
		return specific(http.StatusNotFound, "template_not_found", resTemplate)
	case ErrSnapshotNotFound:
		return specific(http.StatusNotFound, "snapshot_not_found", resSnapshot)
	case ErrVolumeNotFound:
		return specific(http.StatusNotFound, "volume_not_found", resVolume)
	case ErrFileNotFound:
		return st == http.StatusNotFound && e.res == resFile
	case ErrSecretNotFound:
		return specific(http.StatusNotFound, "secret_not_found", resSecret)
	case ErrVolumeInUse:
		return specific(http.StatusConflict, "volume_in_use", resVolume)
	case ErrUnauthorized:
		return st == http.StatusUnauthorized
	case ErrForbidden:
		return st == http.StatusForbidden
	case ErrInvalidArgument:
		return st == http.StatusBadRequest
	case ErrConflict:
		return st == http.StatusConflict
	case ErrRateLimited:
		return st == http.StatusTooManyRequests
	case ErrServiceBusy:
		return st == http.StatusServiceUnavailable
	case ErrNotEnoughSpace:
		return st == http.StatusInsufficientStorage
	case ErrTimeout:
		return st == http.StatusGatewayTimeout
	}
	return false
}

// apiErrorFrom reads an error response (the body is consumed, up to 64 KiB).
func apiErrorFrom(resp *http.Response, method, path string, res resource) *APIError {
	e := &APIError{StatusCode: resp.StatusCode, Method: method, Path: path, res: res, RetryAfter: retryAfter(resp.Header)}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	var body struct {
		Code      json.RawMessage `json:"code"`
		Message   string          `json:"message"`
		ErrorCode string          `json:"error_code"`
	}
	if json.Unmarshal(raw, &body) == nil {
		// The volume-content API puts a string in code; only ints are statuses.
		if n, err := strconv.Atoi(string(body.Code)); err == nil {
			e.Code = n
		} else if s, err := strconv.Unquote(string(body.Code)); err == nil && e.ErrorCode == "" {
			e.ErrorCode = s
		}
		e.Message = body.Message
		if body.ErrorCode != "" {
			e.ErrorCode = body.ErrorCode
		}
	}
	if e.Message == "" {
		e.Message = strings.TrimSpace(string(raw))
	}
	if e.Message == "" {
		e.Message = http.StatusText(resp.StatusCode)
	}
	return e
}

// retryAfter parses Retry-After as seconds or an HTTP date.
func retryAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(v); err == nil && n >= 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := time.Until(t); d > 0 {
			return d
		}
	}
	return 0
}

// RPCError is a failed envd Connect-RPC call.
type RPCError struct {
	Procedure string
	Code      connect.Code
	Message   string
	res       resource
	err       *connect.Error
}

// Error implements error.
func (e *RPCError) Error() string { return fmt.Sprintf("%s: %s: %s", e.Procedure, e.Code, e.Message) }

// Unwrap returns the underlying *connect.Error.
func (e *RPCError) Unwrap() error { return e.err }

// Is maps Connect codes onto the sentinels as the e2b SDKs do.
func (e *RPCError) Is(target error) bool {
	switch target {
	case ErrNotFound:
		return e.Code == connect.CodeNotFound
	case ErrFileNotFound:
		return e.Code == connect.CodeNotFound && e.res == resFile
	case ErrSandboxNotFound:
		return e.Code == connect.CodeNotFound && e.res == resSandbox
	case ErrInvalidArgument:
		return e.Code == connect.CodeInvalidArgument || e.Code == connect.CodeFailedPrecondition
	case ErrUnauthorized:
		return e.Code == connect.CodeUnauthenticated
	case ErrForbidden:
		return e.Code == connect.CodePermissionDenied
	case ErrAlreadyExists:
		return e.Code == connect.CodeAlreadyExists
	case ErrRateLimited:
		return e.Code == connect.CodeResourceExhausted
	case ErrTimeout:
		return e.Code == connect.CodeDeadlineExceeded || e.Code == connect.CodeUnavailable
	}
	return false
}

// rpcErr wraps a Connect error. When ctx is done its error is returned
// instead, so errors.Is(err, context.Canceled) keeps working.
func rpcErr(ctx context.Context, procedure string, err error, res resource) error {
	if err == nil {
		return nil
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var ce *connect.Error
	if !errors.As(err, &ce) {
		return err
	}
	return &RPCError{Procedure: procedure, Code: ce.Code(), Message: ce.Message(), res: res, err: ce}
}

// CommandExitError is a command that ran and exited non-zero. Its result
// (output so far, exit code) is kept.
type CommandExitError struct {
	Result *CommandResult
}

// Error implements error.
func (e *CommandExitError) Error() string {
	msg := fmt.Sprintf("command exited with code %d", e.Result.ExitCode)
	if e.Result.Error != "" {
		msg += ": " + e.Result.Error
	}
	if s := strings.TrimSpace(e.Result.Stderr); s != "" {
		if len(s) > 512 {
			s = s[len(s)-512:]
		}
		msg += "; stderr: " + s
	}
	return msg
}
