package builtinimage_test

import (
	"archive/tar"
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/builtinimage"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/template"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

const recipe = "fd8af91a1c4e7c047953c905fc4a9ac66e82a3b736180a59a6b3e27843f1e6a1"

// tree writes a small rootfs at <dir>/<name>/rootfs: files, a directory,
// a symlink and a hard link, and the recipe stamp when rcp is not "".
func tree(t *testing.T, dir, name, rcp string, files map[string]string) string {
	t.Helper()
	root := filepath.Join(dir, name, "rootfs")
	for p, body := range files {
		full := filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("busybox", filepath.Join(root, "bin-sh")); err != nil {
		t.Fatal(err)
	}
	if err := os.Link(filepath.Join(root, "etc/hostname"), filepath.Join(root, "etc/hostname.link")); err != nil {
		t.Fatal(err)
	}
	if rcp != "" {
		if err := os.WriteFile(filepath.Join(dir, name, builtinimage.RecipeFile), []byte(rcp+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func openStore(t *testing.T) *image.Store {
	t.Helper()
	s, err := image.Open(filepath.Join(t.TempDir(), "oci"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func blobs(t *testing.T, s *image.Store) []string {
	t.Helper()
	return testenv.DirNames(t, filepath.Join(s.Dir(), "blobs", "sha256"))
}

// Publishing a built-in twice gives one digest and the second does
// nothing; the same tree published into another store gives the same
// digest (the layer and config are deterministic).
func TestPublishTwiceSameDigest(t *testing.T) {
	dir := t.TempDir()
	tree(t, dir, "mini", recipe, map[string]string{"etc/hostname": "mini\n", "bin/busybox": "#!elf"})
	s := openStore(t)
	im, published, err := builtinimage.Publish(s, dir, "mini")
	if err != nil || !published {
		t.Fatalf("first publish: %v published=%v", err, published)
	}
	if im.Name != "builtin/mini" || !strings.HasPrefix(im.Digest, "sha256:") {
		t.Fatalf("published as %v", im)
	}
	if d, err := s.Resolve("builtin/mini:" + recipe); err != nil || d.Digest.String() != im.Digest {
		t.Fatalf("tag builtin/mini:<recipe>: %v %v, want %s", d.Digest, err, im.Digest)
	}
	before := blobs(t, s)
	again, published, err := builtinimage.Publish(s, dir, "mini")
	if err != nil || published || again != im {
		t.Fatalf("second publish: %v %v published=%v, want %v unchanged", again, err, published, im)
	}
	if after := blobs(t, s); !slices.Equal(before, after) {
		t.Fatalf("the second publish wrote blobs: %v -> %v", before, after)
	}
	if ups, _ := os.ReadDir(filepath.Join(s.Dir(), "uploads")); len(ups) != 0 {
		t.Fatalf("uploads left: %v", ups)
	}
	other, _, err := builtinimage.Publish(openStore(t), dir, "mini")
	if err != nil || other != im {
		t.Fatalf("same tree in another store: %v %v, want %v", other, err, im)
	}
}

// The code interpreter is two layers, base's then its own: base is
// published too, and its layer blob is the very one base's image has.
func TestCodeInterpreterSharesBaseBlob(t *testing.T) {
	dir := t.TempDir()
	tree(t, dir, template.BaseTemplate, recipe, map[string]string{"etc/hostname": "base\n", "usr/bin/python3": "py"})
	ciRecipe := strings.Repeat("ab", 32)
	tree(t, dir, template.CodeInterpreterTemplate, ciRecipe, map[string]string{"etc/hostname": "ci\n", "usr/local/bin/jupyter": "j"})
	s := openStore(t)
	ci, published, err := builtinimage.Publish(s, dir, template.CodeInterpreterTemplate)
	if err != nil || !published || ci.Name != "builtin/code-interpreter-v1" {
		t.Fatalf("publish: %v %v %v", ci, published, err)
	}
	base, err := s.Get("builtin/base:" + recipe)
	if err != nil {
		t.Fatalf("base was not published below the code interpreter: %v", err)
	}
	img, err := s.Get("builtin/code-interpreter-v1:" + ciRecipe)
	if err != nil {
		t.Fatal(err)
	}
	bl, _ := base.Layers()
	cl, _ := img.Layers()
	if len(bl) != 1 || len(cl) != 2 {
		t.Fatalf("layers: base %d, code interpreter %d; want 1 and 2", len(bl), len(cl))
	}
	bd, _ := bl[0].Digest()
	cd, _ := cl[0].Digest()
	if bd != cd {
		t.Fatalf("the code interpreter's lower layer %s is not base's %s", cd, bd)
	}
	// base's own publish is then a no-op with the same digest.
	bim, published, err := builtinimage.Publish(s, dir, template.BaseTemplate)
	if err != nil || published {
		t.Fatalf("base after the code interpreter: %v published=%v", err, published)
	}
	if d, _ := base.Digest(); bim.Digest != d.String() {
		t.Fatalf("base digest %s, want %s", bim.Digest, d)
	}
}

// Without a recipe stamp the tag is derived from the rootfs directory's
// identity: stable while it stays, new once a rebuild replaces it. A
// stamp that is not a SHA-256 is refused.
func TestTagWithoutRecipe(t *testing.T) {
	dir := t.TempDir()
	root := tree(t, dir, "x", "", map[string]string{"etc/hostname": "x\n"})
	t1, err := builtinimage.Tag(dir, "x")
	if err != nil || !strings.HasPrefix(t1, "stat-") || len(t1) != len("stat-")+32 {
		t.Fatalf("derived tag %q, %v", t1, err)
	}
	if t2, _ := builtinimage.Tag(dir, "x"); t2 != t1 {
		t.Fatalf("tag changed with nothing rebuilt: %q -> %q", t1, t2)
	}
	// A rebuild renamed into place (as scripts/build-rootfs does).
	if err := os.Rename(root, root+".old"); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if t3, _ := builtinimage.Tag(dir, "x"); t3 == t1 {
		t.Fatalf("a replaced rootfs kept tag %q", t1)
	}
	if err := os.WriteFile(filepath.Join(dir, "x", builtinimage.RecipeFile), []byte("not-a-hash"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := builtinimage.Tag(dir, "x"); err == nil {
		t.Fatal("a recipe stamp that is not a SHA-256 was accepted")
	}
}

// layerEntries lists the names in an image's top layer.
func layerEntries(t *testing.T, s *image.Store, ref string) []string {
	t.Helper()
	img, err := s.Get(ref)
	if err != nil {
		t.Fatal(err)
	}
	ls, _ := img.Layers()
	rc, err := ls[len(ls)-1].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var out []string
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, h.Name)
	}
}

// An overlay upper directory's whiteouts (character devices 0/0) and
// opaque directories become OCI whiteouts.
func TestOverlayWhiteoutsTranslated(t *testing.T) {
	testenv.RequireRoot(t, "mknod and trusted.* xattrs")
	dir := t.TempDir()
	root := tree(t, dir, "up", recipe, map[string]string{"etc/hostname": "up\n", "opt/keep": "k"})
	if err := unix.Mknod(filepath.Join(root, "etc/gone"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(root, "opt"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	s := openStore(t)
	if _, _, err := builtinimage.Publish(s, dir, "up"); err != nil {
		t.Fatal(err)
	}
	names := layerEntries(t, s, "builtin/up:"+recipe)
	for _, want := range []string{"etc/.wh.gone", "opt/.wh..wh..opq", "opt/keep"} {
		if !slices.Contains(names, want) {
			t.Fatalf("layer lacks %s: %v", want, names)
		}
	}
	if slices.Contains(names, "etc/gone") {
		t.Fatalf("the whiteout device itself is in the layer: %v", names)
	}

	// A real device node is left out (nodes never make them); a metacopy
	// file (data in the lower layer) is refused.
	dev := tree(t, dir, "dev", recipe, map[string]string{"etc/hostname": "d\n"})
	if err := unix.Mknod(filepath.Join(dev, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))); err != nil {
		t.Fatal(err)
	}
	if _, _, err := builtinimage.Publish(s, dir, "dev"); err != nil {
		t.Fatalf("a device node in a built-in: %v", err)
	}
	if names := layerEntries(t, s, "builtin/dev:"+recipe); slices.Contains(names, "null") || !slices.Contains(names, "etc/hostname") {
		t.Fatalf("layer with a device node: %v", names)
	}
	mc := tree(t, dir, "meta", recipe, map[string]string{"etc/hostname": "m\n"})
	if err := unix.Setxattr(filepath.Join(mc, "etc/hostname"), "trusted.overlay.metacopy", nil, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := builtinimage.Publish(s, dir, "meta"); !errors.Is(err, image.ErrOverlayEntry) {
		t.Fatalf("a metacopy file: %v, want ErrOverlayEntry", err)
	}
}

// The publisher publishes every built-in present (not the cache or other
// directories), base first, answers Lookup from memory, and retries one
// that failed until it succeeds.
func TestPublisherRetries(t *testing.T) {
	dir := t.TempDir()
	tree(t, dir, "mini", recipe, map[string]string{"etc/hostname": "mini\n"})
	tree(t, dir, "broken", "", map[string]string{"etc/hostname": "b\n"})
	stamp := filepath.Join(dir, "broken", builtinimage.RecipeFile)
	if err := os.WriteFile(stamp, []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "cache", "abc"), 0o700); err != nil {
		t.Fatal(err)
	}
	if got, err := builtinimage.Present(dir); err != nil || !slices.Equal(got, []string{"broken", "mini"}) {
		t.Fatalf("Present = %v, %v", got, err)
	}
	s := openStore(t)
	p := &builtinimage.Publisher{Store: s, Dir: dir, Logger: slog.New(slog.DiscardHandler), MaxBackoff: time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	wait := func(name string) {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			if _, ok := p.Lookup(name); ok {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never published", name)
			}
		}
	}
	wait("mini")
	if _, ok := p.Lookup("broken"); ok {
		t.Fatal("a built-in with a bad stamp was published")
	}
	if err := os.WriteFile(stamp, []byte(strings.Repeat("cd", 32)), 0o644); err != nil {
		t.Fatal(err)
	}
	wait("broken")
	select {
	case <-done: // everything published: Run returns by itself
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return once everything was published")
	}
	im, _ := p.Lookup("mini")
	if d, err := s.Resolve("builtin/mini:" + recipe); err != nil || d.Digest.String() != im.Digest {
		t.Fatalf("Lookup %v, store %v %v", im, d.Digest, err)
	}
}

func TestNameOf(t *testing.T) {
	for repo, want := range map[string]string{"builtin/mini": "mini", "builtin/code-interpreter-v1": "code-interpreter-v1", "cubicle/tpl": "", "builtin/": "", "builtin/a/b": ""} {
		got, ok := builtinimage.NameOf(repo)
		if got != want && ok || (want == "") == ok {
			t.Errorf("NameOf(%q) = %q %v, want %q", repo, got, ok, want)
		}
	}
}
