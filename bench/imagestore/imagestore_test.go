package imagestore_test

import (
	"crypto/rand"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/image"
	"github.com/cubicle-dev/cubicle/internal/snapstore/snapstoretest"
)

// BenchmarkReplicaPull measures what a node pulling an image through a
// control-plane replica costs when that replica's image store misses
// (the blobs are read through from S3, versitygw on loopback, and
// digest-checked) against a local hit: GET of the manifest, the config
// and every layer from the replica's registry, bodies read to the end.
// The image is ~100 MiB of incompressible files (one layer). Each miss is
// a fresh replica directory. It prints p50/p95/p99 of each and the ratio
// of the p50s.
//
//	go test -run '^$' -bench ReplicaPull -benchtime 5x ./bench/imagestore/
func BenchmarkReplicaPull(b *testing.B) {
	remote, _ := snapstoretest.New(b)
	src := b.TempDir()
	const files, size = 100, 1 << 20
	buf := make([]byte, size)
	for i := range files {
		rand.Read(buf)
		if err := os.WriteFile(filepath.Join(src, fmt.Sprint(i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	a, err := image.Open(filepath.Join(b.TempDir(), "oci"))
	if err != nil {
		b.Fatal(err)
	}
	a.SetRemote(remote)
	if err := a.ImportRootfs("cubicle/bench:1", src); err != nil {
		b.Fatal(err)
	}
	img, err := a.Get("cubicle/bench:1")
	if err != nil {
		b.Fatal(err)
	}
	d, _ := a.Resolve("cubicle/bench:1")
	m, err := img.Manifest()
	if err != nil {
		b.Fatal(err)
	}
	paths := []string{"/v2/cubicle/bench/manifests/" + d.Digest.String(), "/v2/cubicle/bench/blobs/" + m.Config.Digest.String()}
	var total int64
	for _, l := range m.Layers {
		paths = append(paths, "/v2/cubicle/bench/blobs/"+l.Digest.String())
		total += l.Size
	}
	pull := func(url string) {
		for _, p := range paths {
			resp, err := http.Get(url + p)
			if err != nil {
				b.Fatal(err)
			}
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err != nil || resp.StatusCode != http.StatusOK {
				b.Fatalf("GET %s: %d %v", p, resp.StatusCode, err)
			}
		}
	}
	var miss, hit []time.Duration
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		dir := filepath.Join(b.TempDir(), "oci")
		r, err := image.Open(dir)
		if err != nil {
			b.Fatal(err)
		}
		r.SetRemote(remote)
		srv := httptest.NewServer(image.NewRegistry(r))
		b.StartTimer()
		start := time.Now()
		pull(srv.URL)
		miss = append(miss, time.Since(start))
		start = time.Now()
		pull(srv.URL)
		hit = append(hit, time.Since(start))
		b.StopTimer()
		srv.Close()
		os.RemoveAll(dir)
		b.StartTimer()
	}
	b.StopTimer()
	if b.N == 1 {
		return // the probe round
	}
	q := func(v []time.Duration, p float64) time.Duration { return v[int(float64(len(v)-1)*p)] }
	for _, s := range []struct {
		name string
		v    []time.Duration
	}{{"read-through (miss)", miss}, {"local hit", hit}} {
		sort.Slice(s.v, func(i, j int) bool { return s.v[i] < s.v[j] })
		fmt.Printf("%-20s %.1f MiB: p50 %v p95 %v p99 %v (%.0f MiB/s at p50)\n", s.name, float64(total)/(1<<20),
			q(s.v, .5).Round(time.Millisecond), q(s.v, .95).Round(time.Millisecond), q(s.v, .99).Round(time.Millisecond),
			float64(total)/(1<<20)/q(s.v, .5).Seconds())
	}
	fmt.Printf("miss/hit at p50: %.1fx\n", float64(q(miss, .5))/float64(q(hit, .5)))
}
