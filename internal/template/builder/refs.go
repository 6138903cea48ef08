package builder

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// ImageRefs resolves a templateID that looks like an OCI reference
// ("ghcr.io/org/app:1.2", "python:3.13") and is not a catalog template to
// that image in the local store, unpacked once per digest (the CEP's step 5
// fallback, without a registry pull).
type ImageRefs struct {
	Images     *image.Store
	Dir        string // <Dir>/<digest>/rootfs
	Next       template.Resolver
	CPUCount   int
	MemoryMB   int
	DiskSizeMB int

	mu sync.Mutex
}

// Resolve implements template.Resolver.
func (r *ImageRefs) Resolve(ctx context.Context, ref string) (template.Template, error) {
	if !strings.ContainsAny(ref, "/:") {
		return r.Next.Resolve(ctx, ref)
	}
	desc, err := r.Images.Resolve(ref)
	if errors.Is(err, image.ErrNotFound) || errors.Is(err, image.ErrInvalidRef) {
		return r.Next.Resolve(ctx, ref)
	}
	if err != nil {
		return template.Template{}, err
	}
	dir := filepath.Join(r.Dir, desc.Digest.Hex, "rootfs")
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := os.Stat(dir); err != nil {
		if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
			return template.Template{}, err
		}
		if err := r.Images.Unpack(ref, dir); err != nil {
			return template.Template{}, err
		}
	}
	return template.Template{ID: ref, Alias: ref, Layers: []string{dir}, Image: ref, CPUCount: r.CPUCount, MemoryMB: r.MemoryMB, DiskSizeMB: r.DiskSizeMB}, nil
}

// ImageRepository is the repository a template's builds are pushed to in
// the control plane's image store (tagged with the build ID). Nodes cache
// images by it and digest, and report them in node.Info.Images.
func ImageRepository(templateID string) string { return "cubicle/" + templateID }

// TemplateOfRepository is ImageRepository's inverse: the template whose
// builds repository holds (for the scheduler's "image cached" score from
// a node's cached images), false for any other repository.
func TemplateOfRepository(repository string) (string, bool) {
	id, ok := strings.CutPrefix(repository, "cubicle/")
	if !ok || id == "" || strings.Contains(id, "/") {
		return "", false
	}
	return id, true
}
