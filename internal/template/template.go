// Package template resolves the templateID a sandbox is created from into
// the image layers and default resources it runs with.
package template

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"github.com/google/uuid"

	"github.com/cubicle-dev/cubicle/internal/accel"
)

var (
	ErrNotFound = errors.New("template: not found")
	ErrNotReady = errors.New("template: not ready")
)

// Template is a resolved template.
type Template struct {
	ID         string
	Alias      string
	Layers     []string // read-only rootfs dirs, top-most first
	CPUCount   int
	MemoryMB   int
	DiskSizeMB int
	// StartCmd runs once at boot as RunAs; ReadyCmd is polled until it
	// exits 0 before the create answers. Both empty for plain images.
	StartCmd string
	ReadyCmd string
	RunAs    string // "" = the default user
	Workdir  string
	// Env is what every sandbox of the template starts with, under its
	// create's own envVars (CubeAPI's template env; e2b's ENV steps are
	// build-time only and are not here).
	Env     map[string]string
	BuildID string // the build the layers come from (warm pools compare it)
	// Image is what the layers were unpacked from, for a node that does not
	// share the control plane's files: a built-in image's name (no "/" or
	// ":"), or a reference in the control plane's image store ("repo:tag").
	// "" when there is none (a probe of an unfinished build, a build that
	// only re-used another template's rootfs).
	Image string
	// ImageDigest is Image's manifest digest as its build row records it
	// ("sha256:<hex>"): the control plane names the image to a node from
	// it, whichever replica built it. "" for built-ins and older builds.
	ImageDigest string
	PoolSize    int // warm-pool standbys the template keeps (0 = no pool)
	// Accelerators is the template's compatibility contract (nil = CPU-only).
	Accelerators *accel.Contract
}

// Resolver turns a templateID (ID, alias, name:tag) into a Template.
type Resolver interface {
	Resolve(ctx context.Context, ref string) (Template, error)
}

// BaseTemplate is what an empty templateID means.
const BaseTemplate = "base"

// CodeInterpreterTemplate is e2b's code interpreter template (the
// @e2b/code-interpreter and e2b-code-interpreter SDKs' default): the base
// image with a layer holding ipykernel and the scientific stack above it.
const CodeInterpreterTemplate = "code-interpreter-v1"

// builtinAliases are the e2b names of the built-in images.
var builtinAliases = map[string]string{
	"code-interpreter": CodeInterpreterTemplate,
	"python":           BaseTemplate,
}

// LayerSep joins the layers of a layered rootfs in one string (a build's
// Rootfs): overlayfs' own lowerdir separator, which no layer path can hold.
const LayerSep = ":"

// Layers splits a build's rootfs into its layers, top-most first.
func Layers(rootfs string) []string { return strings.Split(rootfs, LayerSep) }

// JoinLayers is the inverse of Layers.
func JoinLayers(layers ...string) string { return strings.Join(layers, LayerSep) }

// ImageLayers are the layers of the image directory <dir>/<name>: its rootfs
// and, for the code interpreter, the base rootfs below it.
func ImageLayers(dir, name string) []string {
	l := []string{filepath.Join(dir, name, "rootfs")}
	if name == CodeInterpreterTemplate {
		l = append(l, filepath.Join(dir, BaseTemplate, "rootfs"))
	}
	return l
}

var nameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,127}$`)

// Images resolves templates to image directories <Dir>/<name>/rootfs.
type Images struct {
	Dir        string
	CPUCount   int
	MemoryMB   int
	DiskSizeMB int
}

// Resolve implements Resolver.
func (im *Images) Resolve(_ context.Context, ref string) (Template, error) {
	if ref == "" {
		ref = BaseTemplate
	}
	name, tag, hasTag := strings.Cut(ref, ":")
	// Local images carry a single build, reachable as "default" or "latest".
	if hasTag && tag != "default" && tag != "latest" {
		return Template{}, fmt.Errorf("%w: %q", ErrNotFound, ref)
	}
	alias := name
	if target, ok := builtinAliases[name]; ok {
		name = target
	}
	if !nameRe.MatchString(name) {
		return Template{}, fmt.Errorf("%w: %q", ErrNotFound, ref)
	}
	layers := ImageLayers(im.Dir, name)
	for _, root := range layers {
		fi, err := os.Stat(root)
		if err != nil || !fi.IsDir() {
			return Template{}, fmt.Errorf("%w: %q", ErrNotFound, ref)
		}
	}
	return Template{
		ID: name, Alias: alias, Layers: layers, Image: name,
		CPUCount: im.CPUCount, MemoryMB: im.MemoryMB, DiskSizeMB: im.DiskSizeMB,
	}, nil
}

// NewBuildID is a random UUID. The CEP's bld_ + 8 hex is not used: e2b's
// SDKs parse every build ID they are given as a UUID (the Python SDK's tag
// and template models fail on anything else), and the SDK wins.
func NewBuildID() string { return uuid.NewString() }

// buildIDSpace names the build IDs that are derived, not drawn.
var buildIDSpace = uuid.MustParse("6f1d3c52-8a0e-4c57-9d7b-2b1f0e6a4c11")

// DerivedBuildID is the build ID of a build made from a name rather than a
// request (a built-in's seeded build, a snapshot's): the same UUID every time
// for the same kind and name, so a restart finds the row it seeded.
func DerivedBuildID(kind, name string) string {
	return uuid.NewSHA1(buildIDSpace, []byte(kind+"\x00"+name)).String()
}
