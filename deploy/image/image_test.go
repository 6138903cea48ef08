//go:build deployimage

package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/testenv"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"
)

const repoRoot = "../.."

// builtins are the images scripts/build-image puts in cubicle-builtins.
var builtins = []string{"base", "code-interpreter-v1", "mini"}

// TestImages runs scripts/build-image (what `make image` runs), then
// unpacks the cubicle image and runs, chrooted into it, every program the
// node and serve exec, and checks the builtins image holds the host's
// built-in images and a shell whose cp copies them out, as the chart's
// init container does. The debootstrap root and the layers are cached in
// CUBICLE_IMAGE_CACHE (default /var/cache/cubicle-image), so only the
// first run on a machine is slow.
func TestImages(t *testing.T) {
	testenv.RequireRoot(t, "debootstrap and the images' file owners need root")
	for _, tool := range []string{"debootstrap", "busybox", "runsc", "go"} {
		testenv.LookPath(t, tool)
	}
	for _, b := range []string{"cubicle", "cubicle-agent", "cubicle-volume-s3", "buildkitd"} {
		if _, err := os.Stat(filepath.Join(repoRoot, "bin", b)); err != nil {
			t.Fatalf("bin/%s: %v (make test-deploy runs make build first)", b, err)
		}
	}
	imagesDir := os.Getenv("CUBICLE_IMAGES_DIR")
	if imagesDir == "" {
		imagesDir = "/var/lib/cubicle/images"
	}
	for _, n := range builtins {
		if _, err := os.Stat(filepath.Join(imagesDir, n, ".recipe-sha256")); err != nil {
			t.Fatalf("built-in image %s: %v (scripts/install builds it)", n, err)
		}
	}

	out := t.TempDir()
	cmd := exec.Command(filepath.Join(repoRoot, "scripts/build-image"), "--out-dir", out, "--repo", "cubicle.test/cubicle", "--tag", "t1")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("scripts/build-image: %v", err)
	}

	t.Run("cubicle", func(t *testing.T) {
		img := load(t, filepath.Join(out, "cubicle.tar"), "cubicle.test/cubicle:t1")
		cf, err := img.ConfigFile()
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(cf.Config.Entrypoint, []string{"cubicle"}) {
			t.Errorf("entrypoint %q, want [cubicle]", cf.Config.Entrypoint)
		}
		root := t.TempDir()
		unpack(t, img, root, nil)
		for _, tc := range []struct{ cmd, want string }{
			{"cubicle --help", "serve"},
			{"cubicle node run --help", "--data-listen"},
			{"cubicle-agent --version", "cubicle-agent"},
			{"cubicle-volume-s3 --help", "S3 volume plugin"},
			{"buildkitd --version", "buildkitd"},
			// BuildKit's OCI worker uses /usr/sbin/runc (internal/template/buildkit).
			{"/usr/sbin/runc --version", "runc version"},
			{"runsc --version", "runsc version"},
			{"nft --version", "nftables"},
			{"iptables --version", "iptables"},
			{"ip -V", "iproute2"},
			{"lxcfs --version", ""},
			{"s3fs --version", "Simple Storage Service"},
			{"fusermount -V", "fusermount"},
			{"mkfs.ext4 -V", "mke2fs"},
			{"mkfs.xfs -V", "mkfs.xfs"},
			{"mount --version", "util-linux"},
			{"unshare --version", "util-linux"},
			{"nsenter --version", "util-linux"},
			{"prlimit --version", "util-linux"},
			{"cat --version", "coreutils"},
			{"sh -c true", ""},
			{"test -s /etc/ssl/certs/ca-certificates.crt", ""},
		} {
			t.Run(tc.cmd, func(t *testing.T) {
				got := chrootRun(t, root, tc.cmd)
				if !strings.Contains(got, tc.want) {
					t.Errorf("%s printed %q, want it to contain %q", tc.cmd, got, tc.want)
				}
			})
		}
	})

	t.Run("builtins", func(t *testing.T) {
		img := load(t, filepath.Join(out, "cubicle-builtins.tar"), "cubicle.test/cubicle-builtins:t1")
		// Every built-in's .recipe-sha256, as the host has it, and mini's shell.
		names := map[string][]byte{}
		links := map[string]string{}
		paxs := map[string]map[string]string{}
		walk(t, img, func(h *tar.Header, body io.Reader) {
			var b []byte
			if strings.HasSuffix(h.Name, ".recipe-sha256") {
				var err error
				if b, err = io.ReadAll(body); err != nil {
					t.Fatal(err)
				}
			}
			names[h.Name] = b
			paxs[h.Name] = h.PAXRecords
			if h.Typeflag == tar.TypeSymlink {
				links[h.Name] = h.Linkname
			}
		})
		for _, n := range builtins {
			want, err := os.ReadFile(filepath.Join(imagesDir, n, ".recipe-sha256"))
			if err != nil {
				t.Fatal(err)
			}
			got, ok := names["images/"+n+"/.recipe-sha256"]
			if !ok || !bytes.Equal(got, want) {
				t.Errorf("images/%s/.recipe-sha256: %q (present %v), want the host's %q", n, got, ok, want)
			}
		}
		// mini's /bin is a symlink to usr/bin.
		sh := "images/mini/rootfs/bin/sh"
		if target, ok := links["images/mini/rootfs/bin"]; ok && !strings.HasPrefix(target, "/") {
			sh = path.Join("images/mini/rootfs", target, "sh")
		}
		if _, ok := names[sh]; !ok {
			t.Errorf("no images/mini/rootfs/bin/sh (%s)", sh)
		}
		// base's ping keeps its file capability (cap_net_raw), as the host has it.
		const capXattr = "security.capability"
		ping := filepath.Join(imagesDir, "base/rootfs/usr/bin/ping")
		capability := make([]byte, 64)
		n, err := unix.Lgetxattr(ping, capXattr, capability)
		if err != nil {
			t.Fatalf("%s: %s: %v (scripts/build-rootfs gives ping a file capability)", ping, capXattr, err)
		}
		capability = capability[:n]
		if got := paxs["images/base/rootfs/usr/bin/ping"]["SCHILY.xattr."+capXattr]; got != string(capability) {
			t.Errorf("images/base/rootfs/usr/bin/ping: %s %x, want the host's %x", capXattr, got, capability)
		}

		// The chart's init container runs the image's sh and cp -a: copy mini
		// out with them (base and code-interpreter-v1 are left packed, for
		// time and disk), a file capability set on its busybox first, which
		// the copy must keep.
		root := t.TempDir()
		unpack(t, img, root, func(name string) bool {
			return !strings.HasPrefix(name, "images/base/") && !strings.HasPrefix(name, "images/code-interpreter-v1/")
		})
		if err := unix.Setxattr(filepath.Join(root, "images/mini/rootfs/usr/bin/busybox"), capXattr, capability, 0); err != nil {
			t.Fatal(err)
		}
		chrootRun(t, root, "mkdir -p /dst && cp -a /images/mini /dst/ && test -e /dst/mini/rootfs/bin/sh && test -s /dst/mini/.recipe-sha256")
		got := make([]byte, 64)
		n, err = unix.Lgetxattr(filepath.Join(root, "dst/mini/rootfs/usr/bin/busybox"), capXattr, got)
		if err != nil || string(got[:n]) != string(capability) {
			t.Errorf("the image's cp -a dropped a file capability: %x (%v), want %x", got[:max(n, 0)], err, capability)
		}
	})
}

func load(t *testing.T, file, tag string) v1.Image {
	t.Helper()
	img, err := tarball.ImageFromPath(file, nil)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	m, err := tarball.LoadManifest(func() (io.ReadCloser, error) { return os.Open(file) })
	if err != nil {
		t.Fatal(err)
	}
	if len(m) != 1 || !slices.Equal(m[0].RepoTags, []string{tag}) {
		t.Errorf("%s names %+v, want one image tagged %s", file, m, tag)
	}
	return img
}

// walk calls fn with each entry of the image's flattened file system and
// its content.
func walk(t *testing.T, img v1.Image, fn func(h *tar.Header, body io.Reader)) {
	t.Helper()
	rc := mutate.Extract(img)
	defer rc.Close()
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		fn(h, tr)
	}
}

// unpack writes the image's flattened file system under root, keeping
// owners and modes; keep, when set, picks the entries written.
func unpack(t *testing.T, img v1.Image, root string, keep func(string) bool) {
	t.Helper()
	walk(t, img, func(h *tar.Header, tr io.Reader) {
		name := filepath.Clean(h.Name)
		if keep != nil && !keep(name) {
			return
		}
		if strings.HasPrefix(name, "..") || filepath.IsAbs(name) {
			t.Fatalf("entry %q escapes the root", h.Name)
		}
		p := filepath.Join(root, name)
		var err error
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
		case tar.TypeSymlink:
			err = os.Symlink(h.Linkname, p)
		case tar.TypeLink:
			err = os.Link(filepath.Join(root, filepath.Clean(h.Linkname)), p)
		case tar.TypeReg:
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600); err == nil {
				_, err = io.Copy(f, tr)
				err = errors.Join(err, f.Close())
			}
		default:
			t.Fatalf("entry %q: unexpected type %c", h.Name, h.Typeflag)
		}
		if err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
		if h.Typeflag == tar.TypeSymlink || h.Typeflag == tar.TypeLink {
			return
		}
		if err := os.Lchown(p, h.Uid, h.Gid); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, h.FileInfo().Mode()); err != nil {
			t.Fatal(err)
		}
	})
}

// chrootRun runs cmd with the image's sh, chrooted into root with a /proc
// of its own (runsc reads /proc/sys at start), and returns its output; a
// failure fails the test. The proc mount lives in a mount namespace of
// its own and goes with the command's last process.
func chrootRun(t *testing.T, root, cmd string) string {
	t.Helper()
	unshare := testenv.LookPath(t, "unshare")
	if err := os.MkdirAll(filepath.Join(root, "proc"), 0o555); err != nil { // the builtins image has none
		t.Fatal(err)
	}
	c := exec.Command(unshare, "--mount", "--pid", "--fork", "--root="+root, "--mount-proc=/proc", "--", "/bin/sh", "-c", cmd+" 2>&1")
	c.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root"}
	out, err := c.Output()
	if err != nil {
		t.Fatalf("%s in the image: %v\n%s", cmd, err, out)
	}
	fmt.Printf("  %s: %s\n", cmd, firstLine(out))
	return string(out)
}

func firstLine(b []byte) string {
	s, _, _ := strings.Cut(strings.TrimSpace(string(b)), "\n")
	return s
}
