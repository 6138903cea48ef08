package nodeset_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/clusterpki/pkitest"
	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodegrpc"
	"github.com/cubicle-dev/cubicle/internal/nodeset"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// infoNode answers Info with its own ID; the other methods are not called.
type infoNode struct {
	node.Node
	id string
}

func (n infoNode) Info(context.Context) (node.Info, error) {
	return node.Info{ID: n.id, Runtime: "fake"}, nil
}

type fixture struct {
	st  *sqlite.Store
	ca  *clusterpki.CA
	cp  *tls.Certificate
	pki *pkitest.PKI
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	p := pkitest.New(t)
	return &fixture{st: p.Store, ca: p.CA, cp: &p.ControlPlane, pki: p}
}

// serveNode starts a real node gRPC server on loopback with node id's
// certificate (accepting only the control plane), answering Info as
// answerAs, and registers id at its address. It returns the address.
func (f *fixture) serveNode(t *testing.T, id, answerAs string) string {
	t.Helper()
	cert := f.pki.Node(t, id)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := nodegrpc.NewServer(infoNode{id: answerAs}, grpc.Creds(credentials.NewTLS(clusterpki.NodeServerConfig(cert, f.ca.Cert))))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	t.Cleanup(func() {
		srv.Stop()
		if err := <-done; err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			t.Errorf("serve %s: %v", id, err)
		}
	})
	addr := ln.Addr().String()
	if err := f.st.RegisterNode(context.Background(), &store.Node{ID: id, Address: addr}); err != nil {
		t.Fatal(err)
	}
	return addr
}

func (f *fixture) set(local node.Node) *nodeset.Set {
	s := nodeset.New(nodeset.Config{LocalID: "local", Local: local, Registry: f.st, CA: f.ca.Cert,
		Certificate: func() (*tls.Certificate, error) { return f.cp, nil }, Revocations: f.st})
	return s
}

func info(t *testing.T, s *nodeset.Set, id string) (string, error) {
	t.Helper()
	n, err := s.Get(context.Background(), id)
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	i, err := n.Info(context.Background())
	return i.ID, err
}

// Calls reach the node the ID names, over mTLS, with one connection per
// node; the local node is answered in-process.
func TestRoutesByNodeID(t *testing.T) {
	f := newFixture(t)
	f.serveNode(t, "node-a", "node-a")
	f.serveNode(t, "node-b", "node-b")
	s := f.set(infoNode{id: "local"})
	defer s.Close()
	for _, id := range []string{"node-a", "node-b", "local", "node-a"} {
		got, err := info(t, s, id)
		if err != nil || got != id {
			t.Fatalf("Info via %s: %q %v", id, got, err)
		}
	}
	a1, _ := s.Get(context.Background(), "node-a")
	a2, _ := s.Get(context.Background(), "node-a")
	if a1 != a2 {
		t.Fatal("the connection to node-a was not reused")
	}
	if id, ok := s.Local(); !ok || id != "local" {
		t.Fatalf("Local: %q %v", id, ok)
	}
	ms, err := s.Members(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range ms {
		ids = append(ids, m.ID)
	}
	if want := []string{"local", "node-a", "node-b"}; !equal(ids, want) {
		t.Fatalf("Members: %v, want %v", ids, want)
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// An ID that is neither local nor registered is a typed NotFound.
func TestUnknownNode(t *testing.T) {
	f := newFixture(t)
	s := f.set(nil)
	defer s.Close()
	_, err := s.Get(context.Background(), "nope")
	if !errors.Is(err, nodeset.ErrUnknownNode) || !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("unknown node: %v", err)
	}
	if _, ok := s.Local(); ok {
		t.Fatal("a set without a local node reports one")
	}
	if _, err := nodeset.Single("local", infoNode{id: "local"}).Get(context.Background(), "node-a"); !errors.Is(err, nodeset.ErrUnknownNode) {
		t.Fatalf("embedded set, remote ID: %v", err)
	}
}

// A node whose certificate names another node is refused even at the
// registered address: the identity is the ID, not the address.
func TestWrongIdentityRefused(t *testing.T) {
	f := newFixture(t)
	addr := f.serveNode(t, "node-b", "node-b")
	// node-a's row points at node-b's listener.
	if err := f.st.RegisterNode(context.Background(), &store.Node{ID: "node-a", Address: addr}); err != nil {
		t.Fatal(err)
	}
	s := f.set(nil)
	defer s.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	n, err := s.Get(ctx, "node-a")
	if err != nil {
		t.Fatal(err)
	}
	if i, err := n.Info(ctx); err == nil {
		t.Fatalf("node-b answered as node-a: %+v", i)
	} else if !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("want an Unavailable class error, got %v", err)
	}
}

// A new address is dialled afresh; a forgotten node's connection goes.
func TestAddressChangeAndForget(t *testing.T) {
	f := newFixture(t)
	f.serveNode(t, "node-a", "first")
	s := f.set(nil)
	defer s.Close()
	if got, err := info(t, s, "node-a"); err != nil || got != "first" {
		t.Fatalf("first: %q %v", got, err)
	}
	f.serveNode(t, "node-a", "second") // re-registers node-a at a new address
	if got, err := info(t, s, "node-a"); err != nil || got != "second" {
		t.Fatalf("after the address changed: %q %v", got, err)
	}
	if err := f.st.ForgetNode(context.Background(), "node-a"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(context.Background(), "node-a"); !errors.Is(err, nodeset.ErrUnknownNode) {
		t.Fatalf("forgotten node: %v", err)
	}
	if ms, err := s.Members(context.Background()); err != nil || len(ms) != 0 {
		t.Fatalf("Members after forget: %+v %v", ms, err)
	}
}

// Live keeps the in-process node and the nodes whose heartbeat is within
// the TTL.
func TestLive(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for id, age := range map[string]time.Duration{"fresh": time.Second, "stale": time.Hour} {
		if err := f.st.RegisterNode(ctx, &store.Node{ID: id, Address: "127.0.0.1:1", HeartbeatAt: time.Now().Add(-age)}); err != nil {
			t.Fatal(err)
		}
	}
	s := f.set(infoNode{id: "local"})
	defer s.Close()
	live, err := s.Live(ctx, 15*time.Second, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, m := range live {
		ids = append(ids, m.ID)
	}
	if want := []string{"fresh", "local"}; !equal(ids, want) {
		t.Fatalf("Live: %v, want %v", ids, want)
	}
}

// A forgotten node's certificate, still valid and from the cluster CA, is
// refused by the control plane's dial: here the old machine answers at the
// address the node ID registered again (a re-joined node's row), and the
// call fails with clusterpki.ErrRevoked instead of reaching it.
func TestForgottenNodeRefusedAtTheDial(t *testing.T) {
	f := newFixture(t)
	addr := f.serveNode(t, "node-a", "node-a")
	ctx := context.Background()
	if err := f.st.ForgetNode(ctx, "node-a"); err != nil {
		t.Fatal(err)
	}
	if err := f.st.RegisterNode(ctx, &store.Node{ID: "node-a", Address: addr}); err != nil {
		t.Fatal(err)
	}
	s := f.set(nil)
	defer s.Close()
	// gRPC reports a failed handshake as Unavailable, without its cause...
	if got, err := info(t, s, "node-a"); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("Info from a forgotten node's certificate: %q %v, want it refused", got, err)
	}
	// ...which is the revocation: the same configuration, dialled directly.
	tc, err := s.TLSConfig("node-a")
	if err != nil {
		t.Fatal(err)
	}
	tc.Certificates = []tls.Certificate{*f.cp}
	tc.GetClientCertificate = nil
	conn, err := tls.Dial("tcp", addr, tc)
	if err == nil {
		conn.Close()
	}
	var re *clusterpki.RevokedError
	if !errors.Is(err, clusterpki.ErrRevoked) || !errors.As(err, &re) || re.Node != "node-a" {
		t.Fatalf("handshake with a forgotten node: %v, want its certificate refused as revoked", err)
	}
	// Another node is unaffected.
	f.serveNode(t, "node-b", "node-b")
	if got, err := info(t, s, "node-b"); err != nil || got != "node-b" {
		t.Fatalf("Info via node-b: %q %v", got, err)
	}
}

// Without a revocation source the set refuses to dial (it would not know
// a forgotten node).
func TestNoRevocationsNoDial(t *testing.T) {
	f := newFixture(t)
	f.serveNode(t, "node-a", "node-a")
	s := nodeset.New(nodeset.Config{Registry: f.st, CA: f.ca.Cert,
		Certificate: func() (*tls.Certificate, error) { return f.cp, nil }})
	defer s.Close()
	if _, err := s.Get(context.Background(), "node-a"); !errors.Is(err, nodeset.ErrNoIdentity) {
		t.Fatalf("Get without revocations: %v, want ErrNoIdentity", err)
	}
}
