package main

import (
	"archive/tar"
	"errors"
	"io"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

// TestBuildCachePush builds an image from a small tree twice (the second
// time every layer comes from the cache, with the same digests), checks
// its files, hard links, symlinks and config, and pushes it to a registry
// (go-containerregistry's, on loopback), reading it back by digest.
func TestBuildCachePush(t *testing.T) {
	src := t.TempDir()
	must(t, os.MkdirAll(filepath.Join(src, "etc", "deep"), 0o755))
	must(t, os.WriteFile(filepath.Join(src, "etc", "deep", "a"), []byte("alpha"), 0o640))
	must(t, os.Link(filepath.Join(src, "etc", "deep", "a"), filepath.Join(src, "etc", "b")))
	must(t, os.Symlink("deep/a", filepath.Join(src, "etc", "c")))
	// Extended attributes go into the layer (ping's file capability is one).
	must(t, unix.Setxattr(filepath.Join(src, "etc", "b"), "user.cubicle", []byte("kept"), 0))
	bin := filepath.Join(t.TempDir(), "tool")
	must(t, os.WriteFile(bin, []byte("#!/bin/sh\n"), 0o755))

	reg := httptest.NewServer(registry.New())
	defer reg.Close()
	u, err := url.Parse(reg.URL)
	must(t, err)
	push := u.Host + "/cubicle/test:v1"

	cache, out := t.TempDir(), t.TempDir()
	o := options{out: filepath.Join(out, "img.tar"), tag: "cubicle.test/img:v1", cacheDir: cache, entrypoint: "tool",
		layers: []string{src + "=/", bin + "=/usr/local/bin/tool,@tool=/usr/local/bin/alias"}}
	must(t, run(t.Context(), o))
	first, err := tarball.ImageFromPath(o.out, nil)
	must(t, err)
	d1, err := first.Digest()
	must(t, err)

	o.push = push
	must(t, run(t.Context(), o))
	second, err := tarball.ImageFromPath(o.out, nil)
	must(t, err)
	if d2, err := second.Digest(); err != nil || d2 != d1 {
		t.Errorf("rebuild from the cache: digest %s (%v), first build %s", d2, err, d1)
	}
	cached, err := filepath.Glob(filepath.Join(cache, "*.tar.gz"))
	must(t, err)
	if len(cached) != 2 {
		t.Errorf("cache holds %d layers, want 2: %v", len(cached), cached)
	}

	cf, err := second.ConfigFile()
	must(t, err)
	if !slices.Equal(cf.Config.Entrypoint, []string{"tool"}) || cf.OS != "linux" {
		t.Errorf("config: entrypoint %q, os %q", cf.Config.Entrypoint, cf.OS)
	}
	files := map[string]*tar.Header{}
	rc := mutate.Extract(second)
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		must(t, err)
		files[h.Name] = h
	}
	rc.Close()
	for n, want := range map[string]byte{
		"etc/": tar.TypeDir, "etc/b": tar.TypeReg, "etc/deep/a": tar.TypeLink, "etc/c": tar.TypeSymlink,
		"usr/": tar.TypeDir, "usr/local/": tar.TypeDir, "usr/local/bin/": tar.TypeDir,
		"usr/local/bin/tool": tar.TypeReg, "usr/local/bin/alias": tar.TypeSymlink,
	} {
		h := files[strings.TrimSuffix(n, "/")]
		if h == nil {
			h = files[n]
		}
		if h == nil || h.Typeflag != want {
			t.Errorf("%s: %+v, want type %c", n, h, want)
		}
	}
	// Walked in lexical order: etc/b is written first, etc/deep/a links to it.
	if h := files["etc/b"]; h != nil && h.Mode&0o777 != 0o640 {
		t.Errorf("etc/b mode %o, want 640", h.Mode)
	}
	if h := files["etc/b"]; h != nil && h.PAXRecords["SCHILY.xattr.user.cubicle"] != "kept" {
		t.Errorf("etc/b extended attributes %q, want user.cubicle=kept", h.PAXRecords)
	}
	if h := files["etc/deep/a"]; h != nil && h.Linkname != "etc/b" {
		t.Errorf("etc/deep/a links to %q, want etc/b", h.Linkname)
	}

	ref, err := name.ParseReference(push)
	must(t, err)
	pulled, err := remote.Image(ref)
	must(t, err)
	if d, err := pulled.Digest(); err != nil || d != d1 {
		t.Errorf("pushed image digest %s (%v), built %s", d, err, d1)
	}
}

func TestBadArguments(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		o    options
		want string
	}{
		{"no out", options{tag: "a:b", layers: []string{dir + "=/"}}, "--out"},
		{"no layer", options{out: filepath.Join(dir, "x.tar"), tag: "a:b"}, "no --layer"},
		{"bad tag", options{out: filepath.Join(dir, "x.tar"), tag: "UPPER CASE", layers: []string{dir + "=/"}}, "--tag"},
		{"bad push", options{out: filepath.Join(dir, "x.tar"), tag: "a:b", push: "::", layers: []string{dir + "=/"}}, "--push"},
		{"no DEST", options{out: filepath.Join(dir, "x.tar"), tag: "a:b", layers: []string{dir}}, "SRC=DEST"},
		{"relative DEST", options{out: filepath.Join(dir, "x.tar"), tag: "a:b", layers: []string{dir + "=usr"}}, "absolute"},
		{"missing SRC", options{out: filepath.Join(dir, "x.tar"), tag: "a:b", layers: []string{dir + "/nope=/x"}}, "no such file"},
		{"symlink as root", options{out: filepath.Join(dir, "x.tar"), tag: "a:b", layers: []string{"@x=/"}}, "symlink"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := run(t.Context(), tc.o)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
