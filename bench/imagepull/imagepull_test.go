package imagepull_test

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/clusterpki/pkitest"
	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/imagecache"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// BenchmarkNodeImagePull measures a remote node's first use of a template
// image (fetch over loopback mTLS from the control plane's registry, verify
// every digest, unpack) against the control plane unpacking the same image
// from its own store, in the same run, and the cache hit every later create
// pays. The image is CUBICLE_BENCH_IMAGE under the images dir (default
// mini).
//
//	go test -run '^$' -bench NodeImagePull -benchtime 1x ./bench/imagepull/
func BenchmarkNodeImagePull(b *testing.B) {
	testenv.RequireRoot(b, "unpacking keeps owners and chroots")
	dir := os.Getenv("CUBICLE_IMAGES_DIR")
	if dir == "" {
		dir = "/var/lib/cubicle/images"
	}
	name := os.Getenv("CUBICLE_BENCH_IMAGE")
	if name == "" {
		name = "mini"
	}
	tmp, err := os.MkdirTemp("/var/tmp", "cubicle-bench-imagepull-")
	if err != nil {
		b.Fatal(err)
	}
	defer os.RemoveAll(tmp)
	imgs, err := image.Open(filepath.Join(tmp, "oci"))
	if err != nil {
		b.Fatal(err)
	}
	ref := "cubicle/bench:" + name
	if err := imgs.ImportRootfs(ref, filepath.Join(dir, name, "rootfs")); err != nil {
		b.Fatal(err)
	}
	desc, err := imgs.Resolve(ref)
	if err != nil {
		b.Fatal(err)
	}
	pki := pkitest.New(b)
	st, ca := pki.Store, pki.CA
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{
		Handler:   image.ForNodes(image.NewRegistry(imgs), func(r *http.Request) (string, error) { return ca.RequestNode(r, time.Now(), st) }),
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS13, Certificates: []tls.Certificate{pki.ControlPlane}, ClientAuth: tls.RequestClientCert},
	}
	go srv.ServeTLS(ln, "", "")
	defer srv.Close()

	cert := pki.Node(b, "bench-node")
	nodeTLS := &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: pki.Roots(), ServerName: clusterpki.JoinServerName, Certificates: []tls.Certificate{cert}}
	r := imagecache.Ref{Repository: "cubicle/bench", Digest: desc.Digest.String()}

	const cold = 5
	var pulls, locals []time.Duration
	var hits []time.Duration
	for i := 0; i < b.N; i++ {
		for j := 0; j < cold; j++ {
			cdir := filepath.Join(tmp, fmt.Sprintf("cache-%d-%d", i, j))
			c, err := imagecache.New(imagecache.Config{Registry: ln.Addr().String(), TLS: nodeTLS, Dir: cdir})
			if err != nil {
				b.Fatal(err)
			}
			t0 := time.Now()
			if _, err := c.Rootfs(context.Background(), r); err != nil {
				b.Fatal(err)
			}
			pulls = append(pulls, time.Since(t0))
			for k := 0; k < 200; k++ {
				t1 := time.Now()
				if _, err := c.Rootfs(context.Background(), r); err != nil {
					b.Fatal(err)
				}
				hits = append(hits, time.Since(t1))
			}
			os.RemoveAll(cdir)

			ldir := filepath.Join(tmp, fmt.Sprintf("local-%d-%d", i, j), "rootfs")
			t2 := time.Now()
			if err := imgs.Unpack(ref, ldir); err != nil {
				b.Fatal(err)
			}
			locals = append(locals, time.Since(t2))
			os.RemoveAll(filepath.Dir(ldir))
		}
	}
	p := func(d []time.Duration, q float64) time.Duration {
		s := append([]time.Duration(nil), d...)
		sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
		return s[int(q*float64(len(s)-1))]
	}
	for _, row := range []struct {
		what string
		d    []time.Duration
	}{{"node pull (fetch+verify+unpack)", pulls}, {"control-plane local unpack", locals}, {"node cache hit", hits}} {
		fmt.Printf("%-34s n=%-5d p50=%-12v p95=%-12v p99=%v\n", row.what, len(row.d), p(row.d, .5), p(row.d, .95), p(row.d, .99))
	}
	fmt.Printf("image %s (%d-byte manifest); pull/local-unpack p50 ratio %.2f\n", name, desc.Size, float64(p(pulls, .5))/float64(p(locals, .5)))
}
