// Package errdefs holds the error classes that survive a wire. Each class
// maps one to one onto a gRPC code (containerd's errdefs is the model), so
// an error returned by a remote node means on the control plane what it
// meant on the node.
//
// A package keeps its own named sentinels (node.ErrNotFound,
// runtime.ErrNotRunning...) and makes them with New: the sentinel keeps its
// identity and its message, and also matches its class with errors.Is.
// Callers that only need the kind of failure (api/errors.go's HTTP status)
// switch on classes; the few errors clients branch on carry a reason
// (google.rpc.ErrorInfo on the wire), which also brings the sentinel back
// on the far side (ToNative).
package errdefs

import (
	"errors"
	"fmt"
	"sync"
)

// The classes. Their messages are gRPC's code names, read by people.
var (
	ErrCanceled           = errors.New("canceled")
	ErrUnknown            = errors.New("unknown")
	ErrInvalidArgument    = errors.New("invalid argument")
	ErrDeadlineExceeded   = errors.New("deadline exceeded")
	ErrNotFound           = errors.New("not found")
	ErrAlreadyExists      = errors.New("already exists")
	ErrPermissionDenied   = errors.New("permission denied")
	ErrResourceExhausted  = errors.New("resource exhausted")
	ErrFailedPrecondition = errors.New("failed precondition")
	ErrAborted            = errors.New("aborted")
	ErrOutOfRange         = errors.New("out of range")
	ErrNotImplemented     = errors.New("not implemented")
	ErrInternal           = errors.New("internal")
	ErrUnavailable        = errors.New("unavailable")
	ErrDataLoss           = errors.New("data loss")
	ErrUnauthenticated    = errors.New("unauthenticated")
)

// ErrConflict is FailedPrecondition under the name HTTP gives it (409):
// the resource is not in a state the call needs (a sandbox that is not
// running, a volume in use). Aborted is for a call that lost a race.
var ErrConflict = ErrFailedPrecondition

// Classes lists every class, in the order Class tests them.
var Classes = []error{
	ErrCanceled, ErrDeadlineExceeded, ErrNotFound, ErrAlreadyExists, ErrInvalidArgument,
	ErrPermissionDenied, ErrUnauthenticated, ErrResourceExhausted, ErrFailedPrecondition,
	ErrAborted, ErrOutOfRange, ErrNotImplemented, ErrUnavailable, ErrDataLoss, ErrInternal, ErrUnknown,
}

// Class is the first class err matches (in Classes' order), or nil.
func Class(err error) error {
	if err == nil {
		return nil
	}
	for _, c := range Classes {
		if errors.Is(err, c) {
			return c
		}
	}
	return nil
}

func isClass(err error) bool {
	for _, c := range Classes {
		if err == c {
			return true
		}
	}
	return false
}

// sentinel is a package's named error in a class. Its message is its own;
// errors.Is matches the sentinel itself and its class.
type sentinel struct {
	msg    string
	class  error
	reason string
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return e.class }

var (
	mu       sync.Mutex
	byReason = map[string]*sentinel{}
)

// New makes a sentinel with message msg in class (one of Classes).
func New(class error, msg string) error {
	if !isClass(class) {
		panic(fmt.Sprintf("errdefs: %v is not a class", class))
	}
	return &sentinel{msg: msg, class: class}
}

// NewReason is New for a sentinel that must keep its identity across a
// wire: reason (snake_case, unique in the process) names it in the
// ErrorInfo, and ToNative returns an error that matches the sentinel.
func NewReason(class error, reason, msg string) error {
	if reason == "" {
		panic("errdefs: empty reason")
	}
	e := New(class, msg).(*sentinel)
	e.reason = reason
	mu.Lock()
	defer mu.Unlock()
	if _, dup := byReason[reason]; dup {
		panic("errdefs: reason " + reason + " registered twice")
	}
	byReason[reason] = e
	return e
}

// Reason is the reason of the first sentinel with one in err's tree, or "".
func Reason(err error) string {
	var r string
	walk(err, func(e error) bool {
		if s, ok := e.(*sentinel); ok && s.reason != "" {
			r = s.reason
			return true
		}
		if w, ok := e.(*wire); ok && w.reason != "" {
			r = w.reason
			return true
		}
		return false
	})
	return r
}

// walk visits err's tree depth first until visit returns true.
func walk(err error, visit func(error) bool) bool {
	if err == nil {
		return false
	}
	if visit(err) {
		return true
	}
	switch u := err.(type) {
	case interface{ Unwrap() error }:
		return walk(u.Unwrap(), visit)
	case interface{ Unwrap() []error }:
		for _, e := range u.Unwrap() {
			if walk(e, visit) {
				return true
			}
		}
	}
	return false
}
