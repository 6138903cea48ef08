// Command image builds a container image from files on this host, without
// Docker: one gzip layer per --layer, a config with --entrypoint, written as
// a docker-archive tar (`docker save`'s format, which `ctr images import`
// and `docker load` read) and optionally pushed to a registry.
// scripts/build-image drives it (`make image`); docs/cluster.md,
// "Installing a cluster", says how the chart uses the images.
//
//	image --out FILE --tag REF [--push REF] [--cache DIR] [--entrypoint CMD]
//	      --layer SRC=DEST[,SRC=DEST...] [--layer ...]
//
// In a --layer, SRC is a file or a directory of this host (a directory's
// contents go under DEST, owners, modes, mtimes and extended attributes
// kept: ping's file capability must survive) or @TARGET for a symlink
// DEST -> TARGET. Each compressed layer is cached under --cache,
// keyed by its sources' paths, modes, owners, sizes and mtimes, so a rebuild
// with unchanged inputs compresses nothing again.
package main

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"maps"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/klauspost/compress/gzip"
	"golang.org/x/sys/unix"
)

// layerFormat is part of every cache key: bump it when the tar layout
// written for the same sources changes.
const layerFormat = "cubicle-image-layer-v2"

type layerList []string

func (l *layerList) String() string     { return strings.Join(*l, " ") }
func (l *layerList) Set(v string) error { *l = append(*l, v); return nil }

func main() {
	var (
		out, tag, push, cacheDir, entrypoint string
		layers                               layerList
	)
	flag.StringVar(&out, "out", "", "docker-archive tar to write")
	flag.StringVar(&tag, "tag", "", "the image's name in the archive (REPO:TAG)")
	flag.StringVar(&push, "push", "", "also push the image to this reference (REGISTRY/REPO:TAG)")
	flag.StringVar(&cacheDir, "cache", "", "directory caching compressed layers (empty: no cache)")
	flag.StringVar(&entrypoint, "entrypoint", "", "the image's entrypoint (one word)")
	flag.Var(&layers, "layer", "SRC=DEST[,SRC=DEST...]: one layer (repeatable, in order)")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, options{out: out, tag: tag, push: push, cacheDir: cacheDir, entrypoint: entrypoint, layers: layers}); err != nil {
		fmt.Fprintln(os.Stderr, "image:", err)
		os.Exit(1)
	}
}

type options struct {
	out, tag, push, cacheDir, entrypoint string
	layers                               []string
}

func run(ctx context.Context, o options) error {
	if flag.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", flag.Args())
	}
	if o.out == "" || o.tag == "" {
		return errors.New("--out and --tag are required")
	}
	if len(o.layers) == 0 {
		return errors.New("no --layer")
	}
	tagRef, err := name.NewTag(o.tag)
	if err != nil {
		return fmt.Errorf("--tag: %w", err)
	}
	var pushRef name.Reference
	if o.push != "" {
		if pushRef, err = name.ParseReference(o.push); err != nil {
			return fmt.Errorf("--push: %w", err)
		}
	}
	specs := make([][]entry, len(o.layers))
	for i, l := range o.layers {
		if specs[i], err = parseLayer(l); err != nil {
			return fmt.Errorf("--layer %q: %w", l, err)
		}
	}
	var ls []v1.Layer
	for i, spec := range specs {
		start := time.Now()
		l, cached, err := buildLayer(ctx, o.cacheDir, spec)
		if err != nil {
			return fmt.Errorf("layer %d (%s): %w", i+1, o.layers[i], err)
		}
		how := "built"
		if cached {
			how = "cached"
		}
		fmt.Printf("  layer %d/%d %s: %s, %s compressed (%s)\n", i+1, len(specs), how, l.digest, mib(l.size), time.Since(start).Round(time.Millisecond))
		layer, err := partial.CompressedToLayer(l)
		if err != nil {
			return err
		}
		ls = append(ls, layer)
	}
	img, err := mutate.AppendLayers(empty.Image, ls...)
	if err != nil {
		return err
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", runtime.GOARCH
	cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	if o.entrypoint != "" {
		cf.Config.Entrypoint = []string{o.entrypoint}
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	start := time.Now()
	if err := os.MkdirAll(filepath.Dir(o.out), 0o755); err != nil {
		return err
	}
	tmp := o.out + ".tmp"
	if err := tarball.WriteToFile(tmp, tagRef, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", o.out, err)
	}
	if err := os.Rename(tmp, o.out); err != nil {
		return err
	}
	fi, err := os.Stat(o.out)
	if err != nil {
		return err
	}
	fmt.Printf("  wrote %s: %s as %s, %s (%s)\n", o.out, o.tag, digest, mib(fi.Size()), time.Since(start).Round(time.Millisecond))
	if pushRef != nil {
		start := time.Now()
		if err := remote.Write(pushRef, img, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
			return fmt.Errorf("pushing %s: %w", pushRef, err)
		}
		fmt.Printf("  pushed %s (%s)\n", pushRef, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// entry is one SRC=DEST of a --layer: a host file or directory, or a
// symlink (link set, src empty).
type entry struct {
	src, dest, link string
}

func parseLayer(s string) ([]entry, error) {
	var es []entry
	for part := range strings.SplitSeq(s, ",") {
		src, dest, ok := strings.Cut(part, "=")
		if !ok || src == "" || dest == "" {
			return nil, fmt.Errorf("%q: want SRC=DEST", part)
		}
		if !path.IsAbs(dest) || path.Clean(dest) != dest {
			return nil, fmt.Errorf("%q: DEST must be a clean absolute path", part)
		}
		if target, ok := strings.CutPrefix(src, "@"); ok {
			if dest == "/" {
				return nil, fmt.Errorf("%q: a symlink cannot be /", part)
			}
			es = append(es, entry{dest: dest, link: target})
			continue
		}
		if _, err := os.Lstat(src); err != nil {
			return nil, err
		}
		es = append(es, entry{src: src, dest: dest})
	}
	return es, nil
}

// item is one file of a layer: its name in the tar (no leading slash) and
// the host file it comes from (empty for directories made up for DEST's
// parents and for symlink entries).
type item struct {
	name, src, link string
	fi              fs.FileInfo
	xattrs          map[string]string
}

// items lists a layer's files in tar order: parents first, then each
// entry's tree in lexical order.
func items(spec []entry) ([]item, error) {
	var out []item
	seen := map[string]bool{}
	parents := func(dest string) {
		var dirs []string
		for d := path.Dir(dest); d != "/"; d = path.Dir(d) {
			dirs = append(dirs, strings.TrimPrefix(d, "/"))
		}
		for i := len(dirs) - 1; i >= 0; i-- {
			if !seen[dirs[i]] {
				seen[dirs[i]] = true
				out = append(out, item{name: dirs[i]})
			}
		}
	}
	for _, e := range spec {
		if e.dest != "/" {
			parents(e.dest)
		}
		if e.link != "" {
			out = append(out, item{name: strings.TrimPrefix(e.dest, "/"), link: e.link})
			continue
		}
		err := filepath.WalkDir(e.src, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(e.src, p)
			if err != nil {
				return err
			}
			n := strings.TrimPrefix(path.Join(e.dest, filepath.ToSlash(rel)), "/")
			if n == "" {
				return nil // the root itself: the runtime makes /
			}
			fi, err := d.Info()
			if err != nil {
				return err
			}
			xa, err := xattrs(p)
			if err != nil {
				return err
			}
			out = append(out, item{name: n, src: p, fi: fi, xattrs: xa})
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// cacheKey hashes what decides a layer's bytes: the format, and each
// item's name, mode, owner, size, mtime and link target.
func cacheKey(its []item) (string, error) {
	h := sha256.New()
	fmt.Fprintln(h, layerFormat)
	for _, it := range its {
		fmt.Fprintf(h, "%q %q", it.name, it.link)
		if it.fi != nil {
			st, _ := it.fi.Sys().(*syscall.Stat_t)
			var uid, gid uint32
			if st != nil {
				uid, gid = st.Uid, st.Gid
			}
			target := ""
			if it.fi.Mode()&fs.ModeSymlink != 0 {
				t, err := os.Readlink(it.src)
				if err != nil {
					return "", err
				}
				target = t
			}
			fmt.Fprintf(h, " %o %d:%d %d %d %q", it.fi.Mode(), uid, gid, it.fi.Size(), it.fi.ModTime().UnixNano(), target)
			for _, k := range slices.Sorted(maps.Keys(it.xattrs)) {
				fmt.Fprintf(h, " %q=%q", k, it.xattrs[k])
			}
		}
		fmt.Fprintln(h)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// cachedLayer is a compressed layer file with its digests recorded, so
// neither is computed again (partial.CompressedToLayer uses DiffID).
type cachedLayer struct {
	path   string
	digest v1.Hash
	diffID v1.Hash
	size   int64
}

type layerMeta struct {
	Digest string `json:"digest"`
	DiffID string `json:"diffID"`
	Size   int64  `json:"size"`
}

func (l *cachedLayer) Digest() (v1.Hash, error)            { return l.digest, nil }
func (l *cachedLayer) DiffID() (v1.Hash, error)            { return l.diffID, nil }
func (l *cachedLayer) Size() (int64, error)                { return l.size, nil }
func (l *cachedLayer) MediaType() (types.MediaType, error) { return types.DockerLayer, nil }
func (l *cachedLayer) Compressed() (io.ReadCloser, error)  { return os.Open(l.path) }

func buildLayer(ctx context.Context, cacheDir string, spec []entry) (*cachedLayer, bool, error) {
	its, err := items(spec)
	if err != nil {
		return nil, false, err
	}
	key, err := cacheKey(its)
	if err != nil {
		return nil, false, err
	}
	dir := cacheDir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "cubicle-image-"); err != nil {
			return nil, false, err
		}
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, err
	}
	file := filepath.Join(dir, key+".tar.gz")
	if l, err := readCached(file); err == nil {
		return l, true, nil
	}
	l, err := writeLayer(ctx, file, its)
	return l, false, err
}

func readCached(file string) (*cachedLayer, error) {
	b, err := os.ReadFile(file + ".json")
	if err != nil {
		return nil, err
	}
	var m layerMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	fi, err := os.Stat(file)
	if err != nil {
		return nil, err
	}
	if fi.Size() != m.Size {
		return nil, fmt.Errorf("%s: %d bytes, recorded %d", file, fi.Size(), m.Size)
	}
	l := &cachedLayer{path: file, size: m.Size}
	if l.digest, err = v1.NewHash(m.Digest); err != nil {
		return nil, err
	}
	if l.diffID, err = v1.NewHash(m.DiffID); err != nil {
		return nil, err
	}
	return l, nil
}

type countWriter struct {
	w io.Writer
	h hash.Hash
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.h.Write(p[:n])
	c.n += int64(n)
	return n, err
}

// writeLayer writes the tar of its, gzipped, to file, hashing the tar
// (diff ID) and the gzip (digest) as it goes, then records both beside it.
func writeLayer(ctx context.Context, file string, its []item) (*cachedLayer, error) {
	tmp := file + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return nil, err
	}
	defer os.Remove(tmp)
	defer f.Close()
	compressed := &countWriter{w: f, h: sha256.New()}
	gz, err := gzip.NewWriterLevel(compressed, gzip.BestSpeed)
	if err != nil {
		return nil, err
	}
	uncompressed := &countWriter{w: gz, h: sha256.New()}
	tw := tar.NewWriter(uncompressed)
	type inode struct{ dev, ino uint64 }
	links := map[inode]string{}
	for _, it := range its {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if err := writeItem(tw, it, func(st *syscall.Stat_t) (string, bool) {
			if st == nil || st.Nlink < 2 {
				return "", false
			}
			k := inode{uint64(st.Dev), st.Ino}
			if first, ok := links[k]; ok {
				return first, true
			}
			links[k] = it.name
			return "", false
		}); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if err := gz.Close(); err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, err
	}
	if err := f.Close(); err != nil {
		return nil, err
	}
	l := &cachedLayer{path: file, size: compressed.n,
		digest: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(compressed.h.Sum(nil))},
		diffID: v1.Hash{Algorithm: "sha256", Hex: hex.EncodeToString(uncompressed.h.Sum(nil))}}
	if err := os.Rename(tmp, file); err != nil {
		return nil, err
	}
	b, err := json.Marshal(layerMeta{Digest: l.digest.String(), DiffID: l.diffID.String(), Size: l.size})
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(file+".json", b, 0o600); err != nil {
		return nil, err
	}
	return l, nil
}

// writeItem writes one file. Devices, FIFOs and sockets are left out: the
// runtime makes /dev, and nothing in an image needs the others.
func writeItem(tw *tar.Writer, it item, hardlink func(*syscall.Stat_t) (string, bool)) error {
	switch {
	case it.link != "":
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeSymlink, Name: it.name, Linkname: it.link, Mode: 0o777, Format: tar.FormatPAX})
	case it.fi == nil:
		return tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: it.name + "/", Mode: 0o755, Format: tar.FormatPAX})
	}
	mode := it.fi.Mode()
	if mode&(fs.ModeDevice|fs.ModeCharDevice|fs.ModeNamedPipe|fs.ModeSocket) != 0 {
		return nil
	}
	target := ""
	if mode&fs.ModeSymlink != 0 {
		t, err := os.Readlink(it.src)
		if err != nil {
			return err
		}
		target = t
	}
	hdr, err := tar.FileInfoHeader(it.fi, target)
	if err != nil {
		return err
	}
	hdr.Name = it.name
	if it.fi.IsDir() {
		hdr.Name += "/"
	}
	// Numeric owners only, and no times but the mtime: the bytes depend on
	// nothing but the files.
	hdr.Uname, hdr.Gname = "", ""
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	hdr.Format = tar.FormatPAX
	for k, v := range it.xattrs {
		if hdr.PAXRecords == nil {
			hdr.PAXRecords = map[string]string{}
		}
		hdr.PAXRecords["SCHILY.xattr."+k] = v
	}
	st, _ := it.fi.Sys().(*syscall.Stat_t)
	if mode.IsRegular() {
		if first, ok := hardlink(st); ok {
			hdr.Typeflag, hdr.Linkname, hdr.Size, hdr.PAXRecords = tar.TypeLink, first, 0, nil
			return tw.WriteHeader(hdr)
		}
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return err
	}
	if !mode.IsRegular() {
		return nil
	}
	f, err := os.Open(it.src)
	if err != nil {
		return err
	}
	defer f.Close()
	n, err := io.Copy(tw, f)
	if err != nil {
		return fmt.Errorf("%s: %w", it.src, err)
	}
	if n != hdr.Size {
		return fmt.Errorf("%s changed while read (%d bytes, stat said %d)", it.src, n, hdr.Size)
	}
	return nil
}

// xattrs reads a file's extended attributes but the build host's SELinux
// label. A file system without them has none.
func xattrs(p string) (map[string]string, error) {
	size, err := unix.Llistxattr(p, nil)
	if errors.Is(err, unix.ENOTSUP) || size == 0 {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%s: listing extended attributes: %w", p, err)
	}
	buf := make([]byte, size)
	if size, err = unix.Llistxattr(p, buf); err != nil {
		return nil, fmt.Errorf("%s: listing extended attributes: %w", p, err)
	}
	var out map[string]string
	for k := range strings.SplitSeq(strings.TrimRight(string(buf[:size]), "\x00"), "\x00") {
		if k == "" || k == "security.selinux" {
			continue
		}
		n, err := unix.Lgetxattr(p, k, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %s: %w", p, k, err)
		}
		v := make([]byte, n)
		if n, err = unix.Lgetxattr(p, k, v); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", p, k, err)
		}
		if out == nil {
			out = map[string]string{}
		}
		out[k] = string(v[:n])
	}
	return out, nil
}
