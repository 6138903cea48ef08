package api

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/imagecache"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/volume"
)

// The sentinels a node returns keep their HTTP status and error code when
// they come back over gRPC (errdefs.ToGRPC on the node, ToNative on the
// control plane), and each is in a class.
func TestNodeErrorsSurviveTheWire(t *testing.T) {
	for _, s := range []error{
		node.ErrNotFound, node.ErrAgentTimeout, node.ErrSnapshotUnsupported, node.ErrRebuildRefused, node.ErrNoExit, node.ErrVolumeDriver,
		node.ErrImageRequest, node.ErrImagesUnsupported, node.ErrSnapshotNotFound,
		imagecache.ErrInvalidRef, imagecache.ErrDigestMismatch, imagecache.ErrPull, imagecache.ErrUnknownImage, imagecache.ErrNoRegistry,
		runtime.ErrNotFound, runtime.ErrAlreadyExists, runtime.ErrNotRunning, runtime.ErrNotPaused, runtime.ErrUnsupported, runtime.ErrSnapshotTooLarge,
		network.ErrNotFound, network.ErrPoolExhausted, network.ErrInvalidPolicy, network.ErrInvalidID, network.ErrExists,
		network.ErrRules, network.ErrUpstream, network.ErrDomainName, network.ErrDomainNotEnforced,
		volume.ErrUnknownDriver, volume.ErrPlugin, volume.ErrPluginTimeout, volume.ErrProtocol,
		accel.ErrIncompatible, accel.ErrNoCapacity, accel.ErrIllegalTransition, accel.ErrNotFound, accel.ErrBusy, accel.ErrInvalid, accel.ErrUncertain,
	} {
		if errdefs.Class(s) == nil || errdefs.Reason(s) == "" {
			t.Errorf("%v: class %v reason %q, want both", s, errdefs.Class(s), errdefs.Reason(s))
			continue
		}
		native := fmt.Errorf("sandbox abc: %w", s)
		wire := errdefs.ToNative(errdefs.ToGRPC(native))
		if !errors.Is(wire, s) || wire.Error() != native.Error() {
			t.Errorf("%v: came back as %v (is=%v)", s, wire, errors.Is(wire, s))
		}
		if statusOf(wire) != statusOf(native) || errorCode(wire) != errorCode(native) {
			t.Errorf("%v: status %d code %q over the wire, %d %q in-process", s, statusOf(wire), errorCode(wire), statusOf(native), errorCode(native))
		}
	}
	// A FieldError's kind survives too (a refused egress proxy is a 400).
	fe := &network.FieldError{Field: "egressProxy", Kind: network.ErrUpstream, Err: errors.New("no egress proxy")}
	if wire := errdefs.ToNative(errdefs.ToGRPC(fe)); statusOf(wire) != statusOf(fe) || !errors.Is(wire, network.ErrInvalidPolicy) {
		t.Errorf("FieldError: %d over the wire, %d in-process", statusOf(wire), statusOf(fe))
	}
}

// A node that cannot be reached (gRPC Unavailable, brought back as the
// errdefs class) is 503 with Retry-After, not an internal error; so is a
// volume whose files no node can serve now.
func TestUnreachableNodeIs503(t *testing.T) {
	down := errdefs.ToNative(errdefs.ToGRPC(errdefs.New(errdefs.ErrUnavailable, "connection refused")))
	if st := statusOf(fmt.Errorf("create sandbox: %w", down)); st != http.StatusServiceUnavailable {
		t.Fatalf("unreachable node: %d", st)
	}
	if st := statusOf(fmt.Errorf("x: %w", control.ErrVolumeUnavailable)); st != http.StatusServiceUnavailable {
		t.Fatalf("volume files unavailable: %d", st)
	}
	// Classes with their own status keep it.
	if st := statusOf(volume.ErrPlugin); st != http.StatusBadGateway {
		t.Fatalf("volume plugin: %d", st)
	}
}
