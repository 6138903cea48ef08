package dataplane_test

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/netip"
	"sort"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/dataplane"
	"github.com/cubicle-dev/cubicle/internal/dataplane/dataplanetest"
)

// BenchmarkDataPlane measures what the data-plane tunnel adds to a request
// to a sandbox's port: the same HTTP server on loopback (standing in for
// the sandbox) reached directly, as embedded mode's proxy does, and through
// a real dataplane.Server with the cluster's mTLS identities, interleaved
// in one run. Cases:
//   - keepalive: a 1 KiB GET on a pooled connection (the proxy's steady
//     state: one tunnel per pooled upstream connection);
//   - newconn: a 1 KiB GET on a fresh connection (direct: a TCP dial;
//     tunnel: TCP + TLS 1.3 handshake + CONNECT + the node's dial);
//   - 8MiB: an 8 MiB download on a pooled connection.
//
// It prints p50/p95/p99 of each and the ratio of the p50s.
//
//	go test -run '^$' -bench DataPlane -benchtime 300x ./bench/dataplane/
func BenchmarkDataPlane(b *testing.B) {
	small := bytes.Repeat([]byte("x"), 1024)
	big := bytes.Repeat([]byte("y"), 8<<20)
	mux := http.NewServeMux()
	mux.HandleFunc("/small", func(w http.ResponseWriter, r *http.Request) { w.Write(small) })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) { w.Write(big) })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	b.Cleanup(func() { srv.Close() })
	port := ln.Addr().(*net.TCPAddr).Port

	pki := dataplanetest.NewPKI(b)
	addr, _ := pki.Serve(b, "node-a", dataplane.ServerConfig{Lookup: func(context.Context, string) (netip.Addr, error) {
		return netip.MustParseAddr("127.0.0.1"), nil
	}})
	// As serve dials: the revocation read through a cache kept a heartbeat
	// interval.
	cl, err := dataplane.NewClient(pki.ControlPlane, pki.CA.Cert, clusterpki.NewRevocationCache(pki.Store, 5*time.Second))
	if err != nil {
		b.Fatal(err)
	}
	var d net.Dialer
	direct := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return d.DialContext(ctx, "tcp", ln.Addr().String())
	}
	tunnel := func(ctx context.Context, _, _ string) (net.Conn, error) {
		return cl.Dial(ctx, "node-a", addr, "sb1", port)
	}
	client := func(dial func(context.Context, string, string) (net.Conn, error), keepAlive bool) *http.Client {
		tr := &http.Transport{DialContext: dial, DisableKeepAlives: !keepAlive, DisableCompression: true}
		b.Cleanup(tr.CloseIdleConnections)
		return &http.Client{Transport: tr}
	}
	cases := []struct{ name, path string }{{"keepalive", "/small"}, {"newconn", "/small"}, {"8MiB", "/big"}}
	sides := []struct {
		name string
		c    map[string]*http.Client
	}{
		{"direct", map[string]*http.Client{"keepalive": client(direct, true), "newconn": client(direct, false), "8MiB": client(direct, true)}},
		{"tunnel", map[string]*http.Client{"keepalive": client(tunnel, true), "newconn": client(tunnel, false), "8MiB": client(tunnel, true)}},
	}
	get := func(c *http.Client, path string) error {
		resp, err := c.Get("http://sb" + path)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		_, err = io.Copy(io.Discard, resp.Body)
		return err
	}
	dur := map[string][]time.Duration{}
	b.ResetTimer()
	for i := range b.N {
		for _, c := range cases {
			for k := range sides {
				s := sides[(i+k)%2] // alternate who goes first: the second finds caches warm
				start := time.Now()
				if err := get(s.c[c.name], c.path); err != nil {
					b.Fatalf("%s %s: %v", s.name, c.name, err)
				}
				dur[c.name+"/"+s.name] = append(dur[c.name+"/"+s.name], time.Since(start))
			}
		}
	}
	b.StopTimer()
	if b.N == 1 {
		return // the probe round; the real one logs
	}
	q := func(v []time.Duration, p float64) time.Duration { return v[int(float64(len(v)-1)*p)] }
	for _, c := range cases {
		for _, s := range sides {
			v := dur[c.name+"/"+s.name]
			sort.Slice(v, func(i, j int) bool { return v[i] < v[j] })
			b.Logf("%-9s %-6s n=%d p50=%s p95=%s p99=%s", c.name, s.name, len(v), q(v, .5), q(v, .95), q(v, .99))
		}
		ratio := float64(q(dur[c.name+"/tunnel"], .5)) / float64(q(dur[c.name+"/direct"], .5))
		b.Logf("%-9s tunnel/direct p50 ratio %.2f", c.name, ratio)
		b.ReportMetric(ratio, c.name+"-tunnel/direct-p50")
	}
}
