package nodegrpc

import (
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"

	nodev1 "github.com/cubicle-dev/cubicle/api/proto/node/v1"
	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/network"
)

// toStatus is the server's side of an error: errdefs.ToGRPC (class, message,
// reason), plus a detail for each typed error a caller inspects with
// errors.As, whose fields a message and a reason cannot carry.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	g := errdefs.ToGRPC(err)
	var ds []protoadapt.MessageV1
	// ToGRPC carries the first reason; an error that wraps two sentinels
	// (node.ErrNotFound and runtime.ErrNotFound) carries the others too.
	if rs := reasons(err); len(rs) > 1 {
		for _, r := range rs[1:] {
			ds = append(ds, &errdetails.ErrorInfo{Reason: r, Domain: errdefs.Domain})
		}
	}
	var fe *network.FieldError
	if errors.As(err, &fe) {
		ds = append(ds, &nodev1.FieldErrorDetail{Field: fe.Field, KindReason: errdefs.Reason(fe.Kind), Message: errText(fe.Err)})
	}
	var ce *accel.CompatError
	if errors.As(err, &ce) {
		ds = append(ds, &nodev1.CompatErrorDetail{Stage: string(ce.Stage), Layer: string(ce.Layer), Device: ce.Device, Detail: ce.Detail})
	}
	if len(ds) == 0 {
		return g
	}
	st, _ := status.FromError(g)
	if s, err := st.WithDetails(ds...); err == nil {
		return s.Err()
	}
	return g
}

// reasons are the errdefs reasons of every sentinel in err's tree, the
// one errdefs.Reason picks first.
func reasons(err error) []string {
	var out []string
	seen := map[string]bool{}
	var walk func(error)
	walk = func(e error) {
		if e == nil {
			return
		}
		if r := errdefs.Reason(e); r != "" && !seen[r] {
			seen[r] = true
			out = append(out, r)
		}
		switch u := e.(type) {
		case interface{ Unwrap() error }:
			walk(u.Unwrap())
		case interface{ Unwrap() []error }:
			for _, x := range u.Unwrap() {
				walk(x)
			}
		}
	}
	walk(err)
	return out
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// fromStatus is the client's side: errdefs.ToNative, and the typed errors
// back from their details, so errors.Is matches the class and sentinel and
// errors.As finds the *network.FieldError or *accel.CompatError the node
// returned.
func fromStatus(err error) error {
	if err == nil {
		return nil
	}
	native := errdefs.ToNative(err)
	st, ok := status.FromError(err)
	if !ok {
		return native
	}
	var typed []error
	first := true
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			// The first is ToNative's; the others are further sentinels.
			if d.GetDomain() != errdefs.Domain {
				continue
			}
			if !first {
				typed = append(typed, sentinel(d.GetReason(), st.Code()))
			}
			first = false
		case *nodev1.FieldErrorDetail:
			fe := &network.FieldError{Field: d.GetField(), Err: errors.New(d.GetMessage())}
			if r := d.GetKindReason(); r != "" {
				fe.Kind = sentinel(r, st.Code())
			}
			typed = append(typed, fe)
		case *nodev1.CompatErrorDetail:
			typed = append(typed, &accel.CompatError{Stage: accel.Stage(d.GetStage()), Layer: accel.Layer(d.GetLayer()), Device: d.GetDevice(), Detail: d.GetDetail()})
		}
	}
	if len(typed) == 0 {
		return native
	}
	return &typedError{native: native, typed: typed}
}

// sentinel is an error that matches the sentinel this process registered
// under reason, in the class of code (the status's: a sentinel wrapped in
// an error is in that error's class).
func sentinel(reason string, code codes.Code) error {
	st, err := status.New(code, reason).WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: errdefs.Domain})
	if err != nil {
		return errdefs.ToNative(status.Error(code, reason))
	}
	return errdefs.ToNative(st.Err())
}

// typedError says what the node's error said and unwraps to it and to the
// errors rebuilt from its details; the node's comes first, so
// errdefs.Class and errdefs.Reason read as they did on the node.
type typedError struct {
	native error
	typed  []error
}

func (e *typedError) Error() string { return e.native.Error() }

func (e *typedError) Unwrap() []error { return append([]error{e.native}, e.typed...) }

// errorToProto and errorFromProto carry an error passed as an argument
// (DenyAccelerators' reason) with its class and reason.
func errorToProto(err error) *nodev1.Error {
	if err == nil {
		return nil
	}
	return &nodev1.Error{Code: uint32(errdefs.Code(err)), Message: err.Error(), Reason: errdefs.Reason(err)}
}

func errorFromProto(p *nodev1.Error) error {
	if p == nil {
		return nil
	}
	st := status.New(codes.Code(p.GetCode()), p.GetMessage())
	if r := p.GetReason(); r != "" {
		if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: r, Domain: errdefs.Domain}); err == nil {
			st = d
		}
	}
	return errdefs.ToNative(st.Err())
}
