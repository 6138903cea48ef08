package errdefs_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
)

var wantCode = map[error]codes.Code{
	errdefs.ErrCanceled: codes.Canceled, errdefs.ErrUnknown: codes.Unknown, errdefs.ErrInvalidArgument: codes.InvalidArgument,
	errdefs.ErrDeadlineExceeded: codes.DeadlineExceeded, errdefs.ErrNotFound: codes.NotFound, errdefs.ErrAlreadyExists: codes.AlreadyExists,
	errdefs.ErrPermissionDenied: codes.PermissionDenied, errdefs.ErrResourceExhausted: codes.ResourceExhausted,
	errdefs.ErrFailedPrecondition: codes.FailedPrecondition, errdefs.ErrAborted: codes.Aborted, errdefs.ErrOutOfRange: codes.OutOfRange,
	errdefs.ErrNotImplemented: codes.Unimplemented, errdefs.ErrInternal: codes.Internal, errdefs.ErrUnavailable: codes.Unavailable,
	errdefs.ErrDataLoss: codes.DataLoss, errdefs.ErrUnauthenticated: codes.Unauthenticated,
}

// Every class is one gRPC code and back, and no two classes share a code.
func TestClassesMapOneToOne(t *testing.T) {
	if len(errdefs.Classes) != len(wantCode) {
		t.Fatalf("%d classes, want %d (one per gRPC error code)", len(errdefs.Classes), len(wantCode))
	}
	seen := map[codes.Code]error{}
	for _, class := range errdefs.Classes {
		code, ok := wantCode[class]
		if !ok {
			t.Fatalf("class %v has no expected code", class)
		}
		if prev, dup := seen[code]; dup {
			t.Fatalf("%v and %v share %v", prev, class, code)
		}
		seen[code] = class
		s := errdefs.New(class, "a "+class.Error()+" thing")
		g := errdefs.ToGRPC(fmt.Errorf("op: %w", s))
		if st, _ := status.FromError(g); st.Code() != code || st.Message() != "op: a "+class.Error()+" thing" {
			t.Fatalf("ToGRPC(%v) = %v %q, want %v and the message", class, st.Code(), st.Message(), code)
		}
		back := errdefs.ToNative(g)
		if !errors.Is(back, class) || back.Error() != "op: a "+class.Error()+" thing" || errdefs.Class(back) != class {
			t.Fatalf("ToNative(%v) = %v (class %v)", code, back, errdefs.Class(back))
		}
		for _, other := range errdefs.Classes {
			if other != class && errors.Is(back, other) {
				t.Fatalf("%v came back also matching %v", class, other)
			}
		}
	}
}

var errThing = errdefs.NewReason(errdefs.ErrFailedPrecondition, "errdefs_test_thing", "thing: not ready")

// A sentinel with a reason keeps its identity across the wire; one
// without keeps its class and message.
func TestSentinelRoundTrip(t *testing.T) {
	wrapped := fmt.Errorf("sandbox x: %w", errThing)
	if !errors.Is(wrapped, errThing) || !errors.Is(wrapped, errdefs.ErrConflict) || errdefs.Reason(wrapped) != "errdefs_test_thing" {
		t.Fatalf("native: is=%v class=%v reason=%q", errors.Is(wrapped, errThing), errdefs.Class(wrapped), errdefs.Reason(wrapped))
	}
	back := errdefs.ToNative(errdefs.ToGRPC(wrapped))
	if !errors.Is(back, errThing) || !errors.Is(back, errdefs.ErrFailedPrecondition) || back.Error() != "sandbox x: thing: not ready" {
		t.Fatalf("over the wire: %v is=%v", back, errors.Is(back, errThing))
	}
	// And again, as a node's error relayed by another hop.
	again := errdefs.ToNative(errdefs.ToGRPC(fmt.Errorf("relay: %w", back)))
	if !errors.Is(again, errThing) || errdefs.Reason(again) != "errdefs_test_thing" {
		t.Fatalf("second hop: %v reason %q", again, errdefs.Reason(again))
	}
	joined := errors.Join(errThing, errors.New("runc: exit status 1"))
	if back := errdefs.ToNative(errdefs.ToGRPC(joined)); !errors.Is(back, errThing) {
		t.Fatalf("joined: %v", back)
	}
	plain := errdefs.New(errdefs.ErrNotFound, "x: gone")
	back = errdefs.ToNative(errdefs.ToGRPC(plain))
	if errors.Is(back, plain) || !errors.Is(back, errdefs.ErrNotFound) || errdefs.Reason(back) != "" {
		t.Fatalf("reasonless sentinel: %v", back)
	}
}

func TestContextAndUnclassifiedErrors(t *testing.T) {
	for _, c := range []struct {
		err   error
		code  codes.Code
		class error
	}{
		{context.Canceled, codes.Canceled, errdefs.ErrCanceled},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), codes.DeadlineExceeded, errdefs.ErrDeadlineExceeded},
		{errors.New("something nobody classified"), codes.Internal, errdefs.ErrInternal},
	} {
		g := errdefs.ToGRPC(c.err)
		if status.Code(g) != c.code {
			t.Fatalf("%v: code %v, want %v", c.err, status.Code(g), c.code)
		}
		back := errdefs.ToNative(g)
		if !errors.Is(back, c.class) || back.Error() != c.err.Error() {
			t.Fatalf("%v came back as %v", c.err, back)
		}
	}
	// The context errors come back as themselves too, for callers that
	// check them.
	if !errors.Is(errdefs.ToNative(errdefs.ToGRPC(context.Canceled)), context.Canceled) ||
		!errors.Is(errdefs.ToNative(errdefs.ToGRPC(context.DeadlineExceeded)), context.DeadlineExceeded) {
		t.Fatal("context errors lost over the wire")
	}
	st := status.Error(codes.Aborted, "already a status")
	if errdefs.ToGRPC(st) != st {
		t.Fatal("a status error was not passed through")
	}
	if errdefs.ToGRPC(nil) != nil || errdefs.ToNative(nil) != nil {
		t.Fatal("nil is not nil")
	}
	if e := errors.New("local"); errdefs.ToNative(e) != e {
		t.Fatal("a non-status error was changed")
	}
}

func TestNewRefusesNonClassesAndDuplicateReasons(t *testing.T) {
	mustPanic := func(name string, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Fatalf("%s did not panic", name)
			}
		}()
		f()
	}
	mustPanic("New with a non-class", func() { errdefs.New(errors.New("x"), "y") })
	mustPanic("NewReason with a taken reason", func() { errdefs.NewReason(errdefs.ErrNotFound, "errdefs_test_thing", "z") })
	mustPanic("NewReason with no reason", func() { errdefs.NewReason(errdefs.ErrNotFound, "", "z") })
}
