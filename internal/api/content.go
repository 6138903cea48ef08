package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/volume/content"
)

// contentResolver adapts the control plane's volume leases to the
// volume-content handler's error vocabulary: a volume leased on the
// in-process node is served here from its directory, one leased on a
// remote node is passed to that node's data plane.
type contentResolver struct {
	mgr   *control.Manager
	nodes VolumeNodes
}

var _ content.Router = contentResolver{}

func (c contentResolver) Open(ctx context.Context, volumeID, token string) (string, func(), error) {
	dir, forward, release, err := c.Route(ctx, volumeID, token)
	if err == nil && forward != nil {
		release()
		return "", nil, fmt.Errorf("%w: volume %s is served by another node", content.ErrNotImplemented, volumeID)
	}
	return dir, release, err
}

func (c contentResolver) Route(ctx context.Context, volumeID, token string) (string, http.Handler, func(), error) {
	t, release, err := c.mgr.OpenVolume(ctx, volumeID, token)
	switch {
	case err == nil && t.Node == "":
		return t.Dir, nil, release, nil
	case err == nil && c.nodes == nil:
		release()
		return "", nil, nil, fmt.Errorf("%w: volume %s is attached on node %s, which this server cannot reach", content.ErrUnavailable, volumeID, t.Node)
	case err == nil:
		return "", c.nodes.Handler(t.Node), release, nil
	case errors.Is(err, control.ErrVolumeNotFound):
		return "", nil, nil, fmt.Errorf("%w: %v", content.ErrNotFound, err)
	case errors.Is(err, control.ErrUnauthorized):
		return "", nil, nil, fmt.Errorf("%w: %v", content.ErrUnauthorized, err)
	case errors.Is(err, control.ErrConflict):
		return "", nil, nil, fmt.Errorf("%w: %v", content.ErrConflict, err)
	case errors.Is(err, control.ErrVolumeUnavailable), errors.Is(err, errdefs.ErrUnavailable):
		return "", nil, nil, fmt.Errorf("%w: %v", content.ErrUnavailable, err)
	}
	return "", nil, nil, err
}
