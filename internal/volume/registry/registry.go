// Package registry routes a driver name to its volume plugin. It lives apart
// from internal/volume because it builds the drivers, which import that
// package.
package registry

import (
	"errors"
	"fmt"
	"strings"

	"github.com/cubicle-dev/cubicle/internal/volume"
	"github.com/cubicle-dev/cubicle/internal/volume/binary"
	"github.com/cubicle-dev/cubicle/internal/volume/local"
	"github.com/cubicle-dev/cubicle/internal/volume/rpc"
)

// Registry holds one plugin per configured driver name, in config order.
type Registry struct {
	names   []string
	plugins map[string]volume.Plugin
	closers []func() error
}

// Open validates cfgs and builds their plugins. Nothing is started or
// connected: binary plugins run per hook and rpc plugins connect on first
// use, so Open succeeds while a plugin daemon is still down.
func Open(cfgs []volume.PluginConfig) (*Registry, error) {
	if err := volume.Validate(cfgs); err != nil {
		return nil, err
	}
	r := &Registry{plugins: make(map[string]volume.Plugin, len(cfgs))}
	for _, c := range cfgs {
		var p volume.Plugin
		switch c.Type {
		case volume.TypeLocal:
			// Config files may omit root; the server fills in its default.
			if c.Root == "" {
				_ = r.Close()
				return nil, fmt.Errorf("%w: volume plugin %q: type local needs root", volume.ErrConfig, c.Name)
			}
			p = local.New(c.Root)
		case volume.TypeBinary:
			p = binary.New(c.BinaryPath, c.Timeout)
		case volume.TypeRPC:
			cl, err := rpc.Dial(c.SocketPath, c.Timeout)
			if err != nil {
				_ = r.Close()
				return nil, fmt.Errorf("volume plugin %q: %w", c.Name, err)
			}
			r.closers = append(r.closers, cl.Close)
			p = cl
		}
		r.names = append(r.names, c.Name)
		r.plugins[c.Name] = p
	}
	return r, nil
}

// Get returns the plugin registered as name; the error wraps
// volume.ErrUnknownDriver.
func (r *Registry) Get(name string) (volume.Plugin, error) {
	if p, ok := r.plugins[name]; ok {
		return p, nil
	}
	known := "none are configured"
	if len(r.names) > 0 {
		known = "known: " + strings.Join(r.names, ", ")
	}
	return nil, fmt.Errorf("%w %q (%s)", volume.ErrUnknownDriver, name, known)
}

// Default is the driver used when a request names none: the first entry,
// or "" when none are configured.
func (r *Registry) Default() string {
	if len(r.names) == 0 {
		return ""
	}
	return r.names[0]
}

// Names lists the driver names in config order.
func (r *Registry) Names() []string { return append([]string(nil), r.names...) }

// Close releases the rpc connections.
func (r *Registry) Close() error {
	var errs []error
	for _, c := range r.closers {
		errs = append(errs, c())
	}
	r.closers = nil
	return errors.Join(errs...)
}
