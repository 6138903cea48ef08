// Package builtinimage publishes the built-in images (base, mini,
// code-interpreter-v1: the <images-dir>/<name>/rootfs trees scripts/install
// builds) into the control plane's image store, so that nodes without them
// pull them by digest like any template image (serve --publish-builtins).
package builtinimage

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// RepositoryPrefix names a built-in's repository: builtin/<name>.
const RepositoryPrefix = "builtin/"

// RecipeFile, beside <name>/rootfs, holds the SHA-256 of the recipe that
// built it (scripts/install writes it): the published tag.
const RecipeFile = ".recipe-sha256"

// Repository is the repository a built-in is published to.
func Repository(name string) string { return RepositoryPrefix + name }

// NameOf is the built-in a repository holds ("builtin/mini" → "mini").
func NameOf(repository string) (string, bool) {
	name, ok := strings.CutPrefix(repository, RepositoryPrefix)
	return name, ok && nameRE.MatchString(name)
}

// nameRE is a built-in's name (as imagecache and template.Images accept
// it) that is also an OCI repository component.
var nameRE = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)

var hexRE = regexp.MustCompile(`^[a-f0-9]{64}$`)

// Tag is the tag name's tree is published under: the recipe hash in
// <dir>/<name>/.recipe-sha256, or, without one, "stat-" and 32 hex of a
// hash of the identity (device, inode, change time) of every layer
// directory of name (template.ImageLayers): a rebuild renamed into place
// gets a new inode, so it gets a new tag, while restarts keep the tag.
func Tag(dir, name string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, name, RecipeFile))
	switch {
	case err == nil:
		t := strings.TrimSpace(string(b))
		if !hexRE.MatchString(t) {
			return "", fmt.Errorf("builtinimage: %s: not a SHA-256 hex digest", filepath.Join(dir, name, RecipeFile))
		}
		return t, nil
	case !errors.Is(err, os.ErrNotExist):
		return "", err
	}
	h := sha256.New()
	for _, l := range template.ImageLayers(dir, name) {
		fi, err := os.Stat(l)
		if err != nil {
			return "", err
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return "", fmt.Errorf("builtinimage: %s: no inode", l)
		}
		fmt.Fprintf(h, "%s %d %d %d.%d\n", l, st.Dev, st.Ino, st.Ctim.Sec, st.Ctim.Nsec)
	}
	return "stat-" + hex.EncodeToString(h.Sum(nil))[:32], nil
}

// Present lists the built-ins in dir: entries <name>/rootfs (directories)
// whose name is a built-in's, base first (the code interpreter's image
// shares its layer).
func Present(dir string) ([]string, error) {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range ents {
		if !e.IsDir() || !nameRE.MatchString(e.Name()) || len(e.Name()) > 128 {
			continue
		}
		if fi, err := os.Stat(filepath.Join(dir, e.Name(), "rootfs")); err == nil && fi.IsDir() {
			out = append(out, e.Name())
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i] == template.BaseTemplate && out[j] != template.BaseTemplate })
	return out, nil
}

// Publish stores built-in name from dir in s as builtin/<name>:<Tag>,
// unless that tag is there already (or in the shared store), and returns
// its reference. The code interpreter is two layers, base's then its own:
// base is published first and its layer blob is shared.
func Publish(s *image.Store, dir, name string) (im node.Image, published bool, err error) {
	im, _, published, err = publish(s, dir, name, nil)
	return im, published, err
}

// publish is Publish, also returning the tagged reference; progress is
// image.Store.PublishDir's, for each layer written.
func publish(s *image.Store, dir, name string, progress func(layer string, written int64)) (im node.Image, ref string, published bool, err error) {
	if !nameRE.MatchString(name) || len(name) > 128 {
		return node.Image{}, "", false, fmt.Errorf("builtinimage: %q is not a built-in image name", name)
	}
	tag, err := Tag(dir, name)
	if err != nil {
		return node.Image{}, "", false, err
	}
	below := ""
	if layers := template.ImageLayers(dir, name); len(layers) == 2 {
		// The lower layer's own image (template.ImageLayers: base).
		lower := filepath.Base(filepath.Dir(layers[1]))
		if _, below, _, err = publish(s, dir, lower, progress); err != nil {
			return node.Image{}, "", false, fmt.Errorf("builtinimage: %s's lower layer: %w", name, err)
		}
	}
	ref = Repository(name) + ":" + tag
	var layerProgress func(int64)
	if progress != nil {
		layerProgress = func(n int64) { progress(name, n) }
	}
	d, published, err := s.PublishDir(ref, below, filepath.Join(dir, name, "rootfs"), layerProgress)
	if err != nil {
		return node.Image{}, "", false, fmt.Errorf("builtinimage: publish %s: %w", name, err)
	}
	return node.Image{Name: Repository(name), Digest: d.String()}, ref, published, nil
}

// Publisher publishes every built-in of Dir into Store in the background
// and answers, from memory, which have been published.
type Publisher struct {
	Store  *image.Store
	Dir    string
	Logger *slog.Logger
	// MaxBackoff bounds the wait between retries of a failed publish
	// (default 5 minutes; the first retry waits a second).
	MaxBackoff time.Duration

	mu   sync.RWMutex
	done map[string]node.Image
}

// Lookup is the published image of built-in name (control.Config's
// BuiltinImage): a map read, no store access.
func (p *Publisher) Lookup(name string) (node.Image, bool) {
	p.mu.RLock()
	defer p.mu.RUnlock()
	im, ok := p.done[name]
	return im, ok
}

// progressEvery is how often a publish in progress is logged.
const progressEvery = 10 * time.Second

// progress logs, at most every progressEvery, how much of image's layers
// has been written.
func (p *Publisher) progress(image string) func(layer string, written int64) {
	next := time.Now().Add(progressEvery)
	return func(layer string, written int64) {
		if now := time.Now(); now.After(next) {
			next = now.Add(progressEvery)
			p.Logger.Info("built-in image: publishing", "image", image, "layer", layer, "written_mib", written>>20)
		}
	}
}

// Run publishes each built-in present in Dir, base first, retrying
// failures with a doubling wait bounded by MaxBackoff, until all are
// published or ctx ends. It logs each image's start, its progress every
// progressEvery, its end (digest, time, whether it was already there) and
// failures.
func (p *Publisher) Run(ctx context.Context) {
	maxWait := p.MaxBackoff
	if maxWait <= 0 {
		maxWait = 5 * time.Minute
	}
	wait := time.Second
	for {
		names, err := Present(p.Dir)
		if err != nil {
			p.Logger.Error("built-in images: list", "dir", p.Dir, "err", err)
		}
		failed := err != nil
		for i, name := range names {
			if _, ok := p.Lookup(name); ok {
				continue
			}
			if ctx.Err() != nil {
				return
			}
			p.Logger.Info("built-in image: publishing", "image", name, "n", i+1, "of", len(names))
			start := time.Now()
			im, _, published, err := publish(p.Store, p.Dir, name, p.progress(name))
			if err != nil {
				failed = true
				p.Logger.Error("built-in image: publish failed (retried)", "image", name, "err", err, "retry_in", wait)
				continue
			}
			p.mu.Lock()
			if p.done == nil {
				p.done = map[string]node.Image{}
			}
			p.done[name] = im
			p.mu.Unlock()
			p.Logger.Info("built-in image: published", "image", name, "ref", im.String(), "built", published, "took", time.Since(start).Round(time.Millisecond))
		}
		if !failed {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, maxWait)
	}
}
