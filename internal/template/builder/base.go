package builder

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/cacerts"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/template"
	"github.com/cubicle-dev/cubicle/internal/template/recipe"
)

// rootfsRef names the image fromTemplate's rootfs (a seeded template's
// layers, which have no image) is imported as. The tag is the layers'
// identity (path, inode, mtime), so a rebuilt base image, which is a new
// directory renamed into place, is imported anew rather than served stale.
func rootfsRef(rootfs string) (string, error) {
	layers := template.Layers(rootfs)
	h := sha256.New()
	for _, l := range layers {
		fi, err := os.Stat(l)
		if err != nil {
			return "", err
		}
		st, _ := fi.Sys().(*syscall.Stat_t)
		var ino uint64
		if st != nil {
			ino = st.Ino
		}
		fmt.Fprintf(h, "%s\x00%d\x00%d\x00", l, ino, fi.ModTime().UnixNano())
	}
	return "cubicle/rootfs-" + filepath.Base(filepath.Dir(layers[0])) + ":" + hex.EncodeToString(h.Sum(nil))[:16], nil
}

// importRootfs imports rootfs into the image store as ref. A layered rootfs
// is read through a read-only overlay of its layers (mounted under work),
// which is the tree its sandboxes see.
func (b *Builder) importRootfs(ref, rootfs, work string) error {
	layers := template.Layers(rootfs)
	if len(layers) == 1 {
		return b.cfg.Images.ImportRootfs(ref, layers[0])
	}
	mnt := filepath.Join(work, "base-rootfs")
	if err := os.MkdirAll(mnt, 0o700); err != nil {
		return err
	}
	// Lower dirs only: overlayfs makes that mount read-only by itself.
	if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY, "lowerdir="+template.JoinLayers(layers...)); err != nil {
		return fmt.Errorf("mount the layers of %s: %w", rootfs, err)
	}
	defer unix.Unmount(mnt, unix.MNT_DETACH)
	return b.cfg.Images.ImportRootfs(ref, mnt)
}

// Where RUN steps find the extra CA certificates: the build context's
// caDir, bind-mounted at caMount.
const (
	caDir   = ".cubicle-ca"
	caMount = "/run/cubicle-ca"
)

// caOptions writes the extra CA bundle into the build context and returns
// the RUN options that use it. RUN steps get the bundle through a bind
// mount, never in a layer, and through the variables each client reads
// (OpenSSL and curl, requests and pip, Node.js, git, wget, apt over https),
// so the built image carries nothing of this server's trust.
func caOptions(set *cacerts.Set, context string) (recipe.Options, error) {
	if set == nil {
		return recipe.Options{}, nil
	}
	dir := filepath.Join(context, caDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return recipe.Options{}, err
	}
	bundle := caMount + "/ca-certificates.crt"
	files := map[string][]byte{
		"ca-certificates.crt": set.BuildBundle(),
		"wgetrc":              []byte("ca_certificate = " + bundle + "\n"),
		"apt.conf":            []byte(`Acquire::https::CAInfo "` + bundle + `";` + "\n"),
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o644); err != nil {
			return recipe.Options{}, err
		}
	}
	return recipe.Options{
		RunMount: "type=bind,source=" + caDir + ",target=" + caMount,
		RunEnv: [][2]string{
			{"SSL_CERT_FILE", bundle}, {"CURL_CA_BUNDLE", bundle}, {"REQUESTS_CA_BUNDLE", bundle}, {"PIP_CERT", bundle},
			{"NODE_EXTRA_CA_CERTS", bundle}, {"GIT_SSL_CAINFO", bundle},
			{"WGETRC", caMount + "/wgetrc"}, {"APT_CONFIG", caMount + "/apt.conf"},
		},
	}, nil
}

// unpack makes the built image name a rootfs at dest. Built FROM a template
// whose rootfs is on disk (fromTemplate, fromBaseImage), only the layers the
// steps added are unpacked, as an overlay layer above that rootfs's layers:
// a build of the 1 GB base then costs what its steps wrote, in time and in
// disk. Otherwise (or if the built image does not start with the base
// image's layers) the whole image is unpacked.
func (b *Builder) unpack(name, baseLocal, fromRootfs, dest string) (string, error) {
	built, err := b.cfg.Images.Get(name)
	if err != nil {
		return "", err
	}
	if fromRootfs != "" && baseLocal != "" {
		if n, ok := b.sharedLayers(built, baseLocal); ok {
			lowers := template.Layers(fromRootfs)
			if err := image.UnpackOverlay(built, n, dest, lowers); err != nil {
				return "", err
			}
			return template.JoinLayers(append([]string{dest}, lowers...)...), nil
		}
	}
	if err := image.UnpackImage(built, dest); err != nil {
		return "", err
	}
	return dest, nil
}

// sharedLayers reports how many layers built has from the base image (by
// uncompressed digest, which survives recompression), and whether built
// starts with all of them.
func (b *Builder) sharedLayers(built v1.Image, baseLocal string) (int, bool) {
	baseImg, err := b.cfg.Images.Get(baseLocal)
	if err != nil {
		return 0, false
	}
	bc, err1 := baseImg.ConfigFile()
	cc, err2 := built.ConfigFile()
	if err1 != nil || err2 != nil {
		return 0, false
	}
	bd, cd := bc.RootFS.DiffIDs, cc.RootFS.DiffIDs
	if len(bd) == 0 || len(cd) < len(bd) {
		return 0, false
	}
	for i := range bd {
		if bd[i] != cd[i] {
			return 0, false
		}
	}
	return len(bd), true
}
