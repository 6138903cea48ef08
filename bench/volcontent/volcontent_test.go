package volcontent_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/dataplane"
	"github.com/cubicle-dev/cubicle/internal/dataplane/dataplanetest"
	"github.com/cubicle-dev/cubicle/internal/volume/content"
)

// dirResolver is the embedded control plane's side: the volume's
// directory on this host.
type dirResolver struct{ dir string }

func (r dirResolver) Open(context.Context, string, string) (string, func(), error) {
	return r.dir, func() {}, nil
}

// nodeRouter is a pure control plane's side: every request is passed to
// node-a through the volume proxy.
type nodeRouter struct{ forward http.Handler }

func (r nodeRouter) Open(context.Context, string, string) (string, func(), error) {
	return "", nil, content.ErrNotImplemented
}

func (r nodeRouter) Route(context.Context, string, string) (string, http.Handler, func(), error) {
	return "", r.forward, func() {}, nil
}

// nodeDirs is node-a's attachment of the volume.
type nodeDirs struct{ dir string }

func (d nodeDirs) ContentDir(context.Context, string) (string, error) { return d.dir, nil }

// BenchmarkVolumeContent measures a 64 MiB upload and download through
// the volume-content API on an embedded control plane (the content
// handler over the volume's directory, in process) and on a pure control
// plane (the same handler on the node, reached through the VolumeProxy and
// the node's mTLS data plane), interleaved in one run, on the same
// filesystem. It prints p50/p95/p99, the p50 throughput and the ratio of
// the p50s.
//
//	go test -run '^$' -bench VolumeContent -benchtime 10x ./bench/volcontent/
func BenchmarkVolumeContent(b *testing.B) {
	data := bytes.Repeat([]byte("0123456789abcdef"), 64<<20/16)
	embDir, nodeDir := filepath.Join(b.TempDir(), "emb"), filepath.Join(b.TempDir(), "node")
	for _, d := range []string{embDir, nodeDir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			b.Fatal(err)
		}
	}
	pki := dataplanetest.NewPKI(b)
	addr, _ := pki.Serve(b, "node-a", dataplane.ServerConfig{
		Lookup:  func(context.Context, string) (netip.Addr, error) { return netip.Addr{}, dataplane.ErrUnknownSandbox },
		Volumes: nodeDirs{nodeDir},
	})
	vp := dataplane.NewVolumeProxy(pki.Client(b), func(context.Context, string) (string, error) { return addr, nil })
	b.Cleanup(vp.Close)
	emb := httptest.NewServer(content.NewHandler(dirResolver{embDir}, nil))
	b.Cleanup(emb.Close)
	clu := httptest.NewServer(content.NewHandler(nodeRouter{vp.Handler("node-a")}, nil))
	b.Cleanup(clu.Close)
	sides := []struct{ name, url string }{{"embedded", emb.URL}, {"node", clu.URL}}
	put := func(base string) error {
		req, _ := http.NewRequest("PUT", base+"/volumecontent/v/file?path=/big", bytes.NewReader(data))
		req.Header.Set("Authorization", "Bearer t")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return &statusError{resp.StatusCode}
		}
		return nil
	}
	get := func(base string) error {
		req, _ := http.NewRequest("GET", base+"/volumecontent/v/file?path=/big", nil)
		req.Header.Set("Authorization", "Bearer t")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		n, err := io.Copy(io.Discard, resp.Body)
		if err == nil && (resp.StatusCode != 200 || n != int64(len(data))) {
			return &statusError{resp.StatusCode}
		}
		return err
	}
	ops := []struct {
		name string
		do   func(string) error
	}{{"write", put}, {"read", get}}
	dur := map[string][]time.Duration{}
	b.ResetTimer()
	for i := range b.N {
		for _, op := range ops {
			for k := range sides {
				s := sides[(i+k)%2] // alternate who goes first
				start := time.Now()
				if err := op.do(s.url); err != nil {
					b.Fatalf("%s %s: %v", s.name, op.name, err)
				}
				dur[op.name+"/"+s.name] = append(dur[op.name+"/"+s.name], time.Since(start))
			}
		}
	}
	b.StopTimer()
	if b.N == 1 {
		return // the probe round; the real one logs
	}
	q := func(v []time.Duration, p float64) time.Duration { return v[int(float64(len(v)-1)*p)] }
	for _, op := range ops {
		for _, s := range sides {
			v := dur[op.name+"/"+s.name]
			sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
			b.Logf("64MiB %-5s %-8s n=%d p50=%s p95=%s p99=%s (%.0f MiB/s at p50)", op.name, s.name, len(v),
				q(v, .5), q(v, .95), q(v, .99), 64/q(v, .5).Seconds())
		}
		ratio := float64(q(dur[op.name+"/node"], .5)) / float64(q(dur[op.name+"/embedded"], .5))
		b.Logf("64MiB %-5s node/embedded p50 ratio %.2f", op.name, ratio)
		b.ReportMetric(ratio, op.name+"-node/embedded-p50")
	}
}

type statusError struct{ status int }

func (e *statusError) Error() string { return http.StatusText(e.status) }
