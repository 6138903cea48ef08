package join_test

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/postgres"
	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// BenchmarkJoin measures the control plane's side of one join (check the
// CSR, redeem the token, sign the certificate) on PostgreSQL and SQLite
// in the same run, with p50/p95/p99 and the ratio of the p50s. The TLS
// handshake and HTTP are not in it.
//
//	go test -run '^$' -bench Join -benchtime 200x ./bench/join/
func BenchmarkJoin(b *testing.B) {
	ctx := context.Background()
	pg, err := postgres.Open(ctx, pgtest.DSN(b))
	if err != nil {
		b.Fatal(err)
	}
	defer pg.Close()
	lite, err := sqlite.Open(filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer lite.Close()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	csr := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	measure := func(st store.Store, n int) []time.Duration {
		sec, _ := secret.New(st, bytes.Repeat([]byte{9}, secret.KeySize))
		ca, err := clusterpki.LoadOrCreateCA(ctx, st, sec)
		if err != nil {
			b.Fatal(err)
		}
		svc := &nodejoin.Service{Store: st, CA: ca}
		out := make([]time.Duration, 0, n)
		for i := range n {
			tok, _, err := nodejoin.Create(ctx, st, time.Hour, nil, time.Now())
			if err != nil {
				b.Fatal(err)
			}
			start := time.Now()
			if _, err := svc.Join(ctx, nodejoin.Request{Token: tok, NodeID: fmt.Sprintf("node-%d", i), CSR: csr, Addresses: []string{"10.0.0.1"}}); err != nil {
				b.Fatal(err)
			}
			out = append(out, time.Since(start))
		}
		sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
		return out
	}
	b.ResetTimer()
	pgD := measure(pg, b.N)
	liteD := measure(lite, b.N)
	b.StopTimer()
	q := func(d []time.Duration, p float64) time.Duration { return d[int(float64(len(d)-1)*p)] }
	for _, r := range []struct {
		name string
		d    []time.Duration
	}{{"postgres", pgD}, {"sqlite", liteD}} {
		b.Logf("%-8s n=%d p50=%s p95=%s p99=%s", r.name, len(r.d), q(r.d, .5), q(r.d, .95), q(r.d, .99))
	}
	b.ReportMetric(float64(q(pgD, .5))/float64(q(liteD, .5)), "pg/sqlite-p50")
}

// BenchmarkNodeAuth measures what every node call (register, heartbeat,
// renew, secret, registry read) pays to authenticate its certificate:
// the chain and identity check plus the revocation read (one primary-key
// lookup), against a forgotten-and-rejoined node ID, on PostgreSQL and
// SQLite in the same run. The chain check alone is reported beside it, so
// the difference is the read.
//
//	go test -run '^$' -bench NodeAuth -benchtime 2000x ./bench/join/
func BenchmarkNodeAuth(b *testing.B) {
	ctx := context.Background()
	pg, err := postgres.Open(ctx, pgtest.DSN(b))
	if err != nil {
		b.Fatal(err)
	}
	defer pg.Close()
	lite, err := sqlite.Open(filepath.Join(b.TempDir(), "bench.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer lite.Close()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	der, _ := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{}, key)
	csr := string(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}))
	runs := 0
	measure := func(st store.Store, n int, withRead bool) []time.Duration {
		runs++
		id := fmt.Sprintf("auth-node-%d", runs) // the benchmark body runs more than once on these stores
		sec, _ := secret.New(st, bytes.Repeat([]byte{9}, secret.KeySize))
		ca, err := clusterpki.LoadOrCreateCA(ctx, st, sec)
		if err != nil {
			b.Fatal(err)
		}
		svc := &nodejoin.Service{Store: st, CA: ca}
		join := func() *x509.Certificate {
			tok, _, err := nodejoin.Create(ctx, st, time.Hour, nil, time.Now())
			if err != nil {
				b.Fatal(err)
			}
			out, err := svc.Join(ctx, nodejoin.Request{Token: tok, NodeID: id, CSR: csr, Addresses: []string{"10.0.0.1"}})
			if err != nil {
				b.Fatal(err)
			}
			c, err := clusterpki.ParseCertPEM([]byte(out.Certificate))
			if err != nil {
				b.Fatal(err)
			}
			return c
		}
		if _, err := st.NodeRevokedAt(ctx, id); err != nil {
			b.Fatal(err)
		}
		join()
		if err := st.ForgetNode(ctx, id); err != nil {
			b.Fatal(err)
		}
		cert := join()
		out := make([]time.Duration, 0, n)
		for range n {
			start := time.Now()
			if withRead {
				_, err = ca.AuthenticateNode(ctx, cert, start, st)
			} else {
				_, err = ca.NodeID(cert, start)
			}
			if err != nil {
				b.Fatal(err)
			}
			out = append(out, time.Since(start))
		}
		sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
		return out
	}
	b.ResetTimer()
	pgD := measure(pg, b.N, true)
	liteD := measure(lite, b.N, true)
	chainD := measure(lite, b.N, false)
	b.StopTimer()
	q := func(d []time.Duration, p float64) time.Duration { return d[int(float64(len(d)-1)*p)] }
	for _, r := range []struct {
		name string
		d    []time.Duration
	}{{"postgres", pgD}, {"sqlite", liteD}, {"chain-only", chainD}} {
		b.Logf("%-10s n=%d p50=%s p95=%s p99=%s", r.name, len(r.d), q(r.d, .5), q(r.d, .95), q(r.d, .99))
	}
}
