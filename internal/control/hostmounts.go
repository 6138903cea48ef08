package control

import (
	"fmt"
	"path"
	"sort"

	"github.com/cubicle-dev/cubicle/internal/hostmount"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/store"
)

// ErrForbidden: the caller's key may not ask for this.
var ErrForbidden = fmt.Errorf("forbidden")

// hostMounts validates o's host mounts (CubeSandbox's metadata["host-mount"],
// kept in the row's metadata, from which every boot of the sandbox reads
// them): the list, the caller's right to them, the mount paths, and that
// each host directory exists and is reached without a symlink. The node
// checks the last again when it mounts (runtime.Mount.Under).
func (m *Manager) hostMounts(o *CreateOptions) ([]hostmount.Mount, error) {
	raw, ok := o.Metadata[hostmount.Key]
	if !ok {
		return nil, nil
	}
	if !o.HostMounts {
		// Before any detail of the server's prefixes or host paths: a
		// caller without the right learns only that it lacks it.
		if !hostmount.Asks(raw) {
			return nil, nil
		}
		return nil, fmt.Errorf("%w: host mounts need an admin API key (cubicle apikey create --admin) or a key of a team that serve --host-mount-team names", ErrForbidden)
	}
	ms, err := hostmount.Parse(raw, m.cfg.HostMountPrefixes)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if len(ms) == 0 {
		return nil, nil
	}
	for i, hm := range ms {
		if err := validateMountPath(hm.MountPath); err != nil {
			return nil, invalid("%q entry[%d]: mountPath: %v", hostmount.Key, i, err)
		}
		for _, vm := range o.VolumeMounts {
			if vm.Path != "" && path.Clean(vm.Path) == hm.MountPath {
				return nil, invalid("%q entry[%d]: mountPath %s is also a volume mount's path", hostmount.Key, i, hm.MountPath)
			}
		}
		under, _ := hostmount.Within(hm.HostPath, m.cfg.HostMountPrefixes)
		dir, err := hostmount.OpenDir(under, hm.HostPath)
		if err != nil {
			return nil, invalid("%q entry[%d]: bind mount %s -> %s: %v", hostmount.Key, i, hm.HostPath, hm.MountPath, err)
		}
		dir.Close()
	}
	return ms, nil
}

// hostRuntimeMounts are sb's host mounts for its node, parents before
// children so a nested mount lands on top. A row whose host mounts the
// server no longer allows (its prefixes changed since) does not boot.
func (m *Manager) hostRuntimeMounts(sb *store.Sandbox) ([]runtime.Mount, error) {
	raw, ok := sb.Metadata[hostmount.Key]
	if !ok {
		return nil, nil
	}
	ms, err := hostmount.Parse(raw, m.cfg.HostMountPrefixes)
	if err != nil {
		return nil, fmt.Errorf("%w: sandbox '%s': %w", ErrConflict, sb.ID, err)
	}
	out := make([]runtime.Mount, 0, len(ms))
	for _, hm := range ms {
		under, _ := hostmount.Within(hm.HostPath, m.cfg.HostMountPrefixes)
		out = append(out, runtime.Mount{Source: hm.HostPath, Destination: hm.MountPath, ReadOnly: hm.ReadOnly, Under: under})
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Destination < out[j].Destination })
	return out, nil
}

// hasHostMounts: sb mounts host directories, which exist on its node only.
// A value that does not decode counts: it never booted elsewhere either.
func hasHostMounts(sb *store.Sandbox) bool {
	return hostmount.Asks(sb.Metadata[hostmount.Key])
}
