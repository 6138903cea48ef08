package errdefs

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Domain is the ErrorInfo domain of Cubicle's reasons.
const Domain = "cubicle.dev"

var toCode = map[error]codes.Code{
	ErrCanceled: codes.Canceled, ErrUnknown: codes.Unknown, ErrInvalidArgument: codes.InvalidArgument,
	ErrDeadlineExceeded: codes.DeadlineExceeded, ErrNotFound: codes.NotFound, ErrAlreadyExists: codes.AlreadyExists,
	ErrPermissionDenied: codes.PermissionDenied, ErrResourceExhausted: codes.ResourceExhausted,
	ErrFailedPrecondition: codes.FailedPrecondition, ErrAborted: codes.Aborted, ErrOutOfRange: codes.OutOfRange,
	ErrNotImplemented: codes.Unimplemented, ErrInternal: codes.Internal, ErrUnavailable: codes.Unavailable,
	ErrDataLoss: codes.DataLoss, ErrUnauthenticated: codes.Unauthenticated,
}

var fromCode = func() map[codes.Code]error {
	m := make(map[codes.Code]error, len(toCode))
	for e, c := range toCode {
		m[c] = e
	}
	return m
}()

// Code is the gRPC code of err's class. The context errors are their
// codes; an error nobody classified is Internal (a bug or an unforeseen
// failure of the server, whose message says more).
func Code(err error) codes.Code {
	switch {
	case err == nil:
		return codes.OK
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	}
	if c := Class(err); c != nil {
		return toCode[c]
	}
	return codes.Internal
}

// ToGRPC is err as a gRPC status error: its class's code, its message, and
// its reason (if any) as an ErrorInfo. A status error passes unchanged.
func ToGRPC(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	st := status.New(Code(err), err.Error())
	if r := Reason(err); r != "" {
		if d, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: r, Domain: Domain}); derr == nil {
			st = d
		}
	}
	return st.Err()
}

// wire is an error that came over gRPC: its message, its class and, when
// its reason names a sentinel of this process, that sentinel.
type wire struct {
	msg    string
	class  error
	reason string
	known  error
}

func (e *wire) Error() string { return e.msg }

func (e *wire) Unwrap() []error {
	if e.known != nil {
		return []error{e.known, e.class}
	}
	return []error{e.class}
}

// ToNative turns a gRPC error back into one that matches its class (and its
// sentinel, when the reason names one) with errors.Is, and says the same
// thing. Errors that are not gRPC statuses pass unchanged.
func ToNative(err error) error {
	if err == nil {
		return nil
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	class, ok := fromCode[st.Code()]
	if !ok {
		class = ErrUnknown
	}
	w := &wire{msg: st.Message(), class: class}
	switch st.Code() {
	case codes.Canceled:
		w.class = errors.Join(ErrCanceled, context.Canceled)
	case codes.DeadlineExceeded:
		w.class = errors.Join(ErrDeadlineExceeded, context.DeadlineExceeded)
	}
	for _, d := range st.Details() {
		if info, ok := d.(*errdetails.ErrorInfo); ok && info.GetDomain() == Domain {
			w.reason = info.GetReason()
			mu.Lock()
			if s, ok := byReason[w.reason]; ok {
				w.known = s
			}
			mu.Unlock()
			break
		}
	}
	return w
}
