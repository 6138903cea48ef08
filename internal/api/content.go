package api

import (
	"context"
	"errors"
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/control"
	"github.com/cubicle-dev/cubicle/internal/volume/content"
)

// contentResolver adapts the control plane's volume leases to the
// volume-content handler's error vocabulary.
type contentResolver struct{ mgr *control.Manager }

func (c contentResolver) Open(ctx context.Context, volumeID, token string) (string, func(), error) {
	dir, release, err := c.mgr.OpenVolume(ctx, volumeID, token)
	switch {
	case err == nil:
		return dir, release, nil
	case errors.Is(err, control.ErrVolumeNotFound):
		return "", nil, fmt.Errorf("%w: %v", content.ErrNotFound, err)
	case errors.Is(err, control.ErrUnauthorized):
		return "", nil, fmt.Errorf("%w: %v", content.ErrUnauthorized, err)
	case errors.Is(err, control.ErrConflict):
		return "", nil, fmt.Errorf("%w: %v", content.ErrConflict, err)
	case errors.Is(err, control.ErrNoLocalNode):
		return "", nil, fmt.Errorf("%w: %v", content.ErrNotImplemented, err)
	}
	return "", nil, err
}
