package integration

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/dataplane"
	"github.com/cubicle-dev/cubicle/internal/nodejoin"
	"github.com/cubicle-dev/cubicle/internal/secret"
	"github.com/cubicle-dev/cubicle/internal/volume/s3/s3test"
)

// TestClusterBuilderNode: two pure control-plane replicas (PostgreSQL, no
// embedded node) sharing one image store in S3 (--image-store on
// versitygw); replica A builds a template with a RUN step on the node joined with the
// label builder=true: buildkitd there is reached through the node's data
// plane, pulls the base and pushes the image through its relay to the
// control plane's registry, the ready command's check sandbox passes on a
// node, the build becomes ready, and a sandbox of it
// (wherever it lands) runs the file the RUN step wrote; a second build,
// with credentials of its own, pushes too. A node without the
// label has no builder target and cannot push; the builder's certificate
// without the build's credentials cannot push; with no builder ready a
// build with steps is refused (501) naming the label. Replica B, which
// never ran the build, creates a sandbox of it (its image named from the
// build's row, read through from S3 when a node pulls through it), and so
// does replica A after a restart with an empty data dir.
func TestClusterBuilderNode(t *testing.T) {
	requireBuildkit(t)
	gw := s3test.Start(t)
	imageStore := "s3://" + gw.Bucket + "?endpoint=" + url.QueryEscape(gw.Endpoint) + "&region=" + gw.Region + "&pathStyle=true&prefix=images/"
	c := startCluster(t, 2, 2, clusterOptions{
		// --buildkitd= undoes the harness's "off": builds go to builder nodes.
		replica:    []string{"--buildkitd=", "--image-store", imageStore},
		replicaEnv: []string{"CUBICLE_IMAGE_S3_ACCESS_KEY=" + gw.AccessKey, "CUBICLE_IMAGE_S3_SECRET_KEY=" + gw.SecretKey},
		labels:     map[int][]string{0: {"builder=true"}},
	})
	r0, r1 := c.replicas[0], c.replicas[1]
	builderNode, plainNode := c.nodes[0], c.nodes[1]

	start := time.Now()
	// The ready command's check sandbox boots the pushed image on a node.
	tpl, st, logs := r0.buildTemplate(t, "cluster-built", map[string]any{"fromTemplate": "base",
		"steps":    []any{map[string]any{"type": "RUN", "args": []string{"echo built-on-" + builderNode.ID + " > /etc/cluster-build"}}},
		"readyCmd": "grep -q built-on /etc/cluster-build"})
	took := time.Since(start)
	if st.Status != "ready" {
		t.Fatalf("build: %s %+v\n%s\nnode logs:\n%s", st.Status, st.Reason, strings.Join(logs, "\n"), builderNode.logs)
	}
	if !strings.Contains(strings.Join(logs, "\n"), "building on node "+builderNode.ID) {
		t.Fatalf("the build's logs do not name the builder node:\n%s", strings.Join(logs, "\n"))
	}
	t.Logf("build with one RUN step on the builder node: %v", took.Round(time.Millisecond))
	sb := r0.create(map[string]any{"templateID": tpl.TemplateID, "timeout": 300})
	if out := r0.mustRun(sb, "cat /etc/cluster-build"); strings.TrimSpace(out) != "built-on-"+builderNode.ID {
		t.Fatalf("the RUN step's file in a sandbox of the build: %q", out)
	}
	// Replica B never saw the build: the image is named from the build's
	// row and served to nodes from the shared store.
	t0 := time.Now()
	sbB := r1.create(map[string]any{"templateID": tpl.TemplateID, "timeout": 300})
	if out := r1.mustRun(sbB, "cat /etc/cluster-build"); strings.TrimSpace(out) != "built-on-"+builderNode.ID {
		t.Fatalf("the RUN step's file in a sandbox created through replica B: %q", out)
	}
	t.Logf("create + first command through replica B: %v", time.Since(t0).Round(time.Millisecond))
	// Replica A restarts with an empty data dir (a pod's emptyDir): its
	// images come back from the shared store.
	r0.stop(syscall.SIGTERM)
	ents, err := os.ReadDir(r0.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		if err := os.RemoveAll(filepath.Join(r0.DataDir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	r0.start()
	if ents, _ := os.ReadDir(filepath.Join(r0.DataDir, "oci", "blobs", "sha256")); len(ents) != 0 {
		t.Fatalf("replica A's wiped image store holds %d blobs at start", len(ents))
	}
	t0 = time.Now()
	sbA := r0.create(map[string]any{"templateID": tpl.TemplateID, "timeout": 300})
	if out := r0.mustRun(sbA, "cat /etc/cluster-build"); strings.TrimSpace(out) != "built-on-"+builderNode.ID {
		t.Fatalf("the RUN step's file through replica A after its data dir was wiped: %q", out)
	}
	t.Logf("create + first command through replica A after its data dir was wiped: %v", time.Since(t0).Round(time.Millisecond))
	// A second build gets its own registry credentials (the first's were
	// revoked when it ended) and pushes too.
	start2 := time.Now()
	_, st2, logs2 := r0.buildTemplate(t, "cluster-built-2", map[string]any{"fromTemplate": "base",
		"steps": []any{map[string]any{"type": "RUN", "args": []string{"echo second > /etc/cluster-build"}}}})
	if st2.Status != "ready" {
		t.Fatalf("second build: %s %+v\n%s", st2.Status, st2.Reason, strings.Join(logs2, "\n"))
	}
	took2 := time.Since(start2)
	t.Logf("a second build (base already imported and cached): %v", took2.Round(time.Millisecond))

	// The control plane's identity, as a replica has it.
	ctx := context.Background()
	key, err := secret.LoadKey(c.secrets)
	if err != nil {
		t.Fatal(err)
	}
	sx, err := secret.New(c.st, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := clusterpki.LoadOrCreateCA(ctx, c.st, sx)
	if err != nil {
		t.Fatal(err)
	}
	cpCert, err := ca.IssueControlPlane(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dp, err := dataplane.NewClient(*cpCert, ca.Cert, c.st)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string]string{}
	for _, n := range c.nodes {
		row, err := c.st.GetNode(ctx, n.ID)
		if err != nil {
			t.Fatal(err)
		}
		rows[n.ID] = row.DataAddress
	}
	if conn, err := dp.DialBuilder(ctx, builderNode.ID, rows[builderNode.ID]); err != nil {
		t.Fatalf("the builder target of the builder node: %v", err)
	} else {
		conn.Close()
	}
	if _, err := dp.DialBuilder(ctx, plainNode.ID, rows[plainNode.ID]); !errors.Is(err, dataplane.ErrNotBuilder) {
		t.Fatalf("the builder target of a node without the label: %v", err)
	}
	// Another node's identity cannot open it either.
	plainPair, err := tls.LoadX509KeyPair(filepath.Join(plainNode.DataDir, nodejoin.CertFile), filepath.Join(plainNode.DataDir, nodejoin.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	peer, err := dataplane.NewClient(plainPair, ca.Cert, c.st)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := peer.DialBuilder(ctx, builderNode.ID, rows[builderNode.ID]); err == nil {
		t.Fatal("a node's certificate opened the builder target")
	}

	// Pushes to the control plane's registry.
	builderPair, err := tls.LoadX509KeyPair(filepath.Join(builderNode.DataDir, nodejoin.CertFile), filepath.Join(builderNode.DataDir, nodejoin.KeyFile))
	if err != nil {
		t.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.Cert)
	push := func(pair tls.Certificate, user, pass string) int {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: clusterpki.JoinServerName,
			Certificates: []tls.Certificate{pair}}}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest("POST", c.cp+"/v2/cubicle/stolen/blobs/uploads/", nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	// The build's row names its image by digest, and a node pulling it by
	// digest through the balancer gets the verified bytes from either
	// replica (new connections alternate), replica A's read through from
	// S3 since its wipe.
	brow, err := c.st.GetTemplateBuild(ctx, tpl.BuildID)
	if err != nil || !strings.HasPrefix(brow.ImageDigest, "sha256:") {
		t.Fatalf("the build's row has no image digest: %+v %v", brow, err)
	}
	pull := func(path, digest string) []byte {
		t.Helper()
		tr := &http.Transport{TLSClientConfig: &tls.Config{MinVersion: tls.VersionTLS13, RootCAs: roots, ServerName: clusterpki.JoinServerName,
			Certificates: []tls.Certificate{plainPair}}}
		defer tr.CloseIdleConnections()
		req, _ := http.NewRequest("GET", c.cp+path, nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if sum := sha256.Sum256(body); err != nil || resp.StatusCode != http.StatusOK || "sha256:"+hex.EncodeToString(sum[:]) != digest {
			t.Fatalf("a node's GET %s: %d, %d bytes, %v", path, resp.StatusCode, len(body), err)
		}
		return body
	}
	repo := "cubicle/" + tpl.TemplateID
	for range 2 {
		var m struct {
			Layers []struct {
				Digest string `json:"digest"`
			} `json:"layers"`
		}
		if err := json.Unmarshal(pull("/v2/"+repo+"/manifests/"+brow.ImageDigest, brow.ImageDigest), &m); err != nil || len(m.Layers) == 0 {
			t.Fatalf("manifest: %v", err)
		}
		for _, l := range m.Layers {
			pull("/v2/"+repo+"/blobs/"+l.Digest, l.Digest)
		}
	}

	if code := push(plainPair, "", ""); code != http.StatusForbidden {
		t.Fatalf("a push by a node without the label: %d, want 403", code)
	}
	if code := push(plainPair, "cubicle", "guess"); code != http.StatusForbidden {
		t.Fatalf("a push with credentials by a node without the label: %d, want 403", code)
	}
	if code := push(builderPair, "", ""); code != http.StatusUnauthorized {
		t.Fatalf("a push by the builder without the build's credentials: %d, want 401", code)
	}
	if code := push(builderPair, "cubicle", "guess"); code != http.StatusUnauthorized {
		t.Fatalf("a push by the builder with wrong credentials: %d, want 401", code)
	}

	// No builder ready (the only one cordoned): a build with steps is
	// refused up front, naming the label.
	if _, err := c.st.SetNodeFlags(ctx, builderNode.ID, true, false); err != nil {
		t.Fatal(err)
	}
	var again tplCreated
	if code := r0.do("POST", "/v3/templates", map[string]any{"name": "no-builder", "cpuCount": 1, "memoryMB": 256}, &again); code != http.StatusAccepted {
		t.Fatalf("create template: %d", code)
	}
	code, _, body := r0.raw("POST", "/v2/templates/"+again.TemplateID+"/builds/"+again.BuildID, map[string]any{"fromTemplate": "base",
		"steps": []any{map[string]any{"type": "RUN", "args": []string{"true"}}}})
	if code != http.StatusNotImplemented || !strings.Contains(string(body), "builder=true") {
		t.Fatalf("a build with no builder ready: %d %s", code, body)
	}
	if _, err := c.st.SetNodeFlags(ctx, builderNode.ID, false, false); err != nil {
		t.Fatal(err)
	}
	if os.Getenv("CUBICLE_BUILD_COMPARE") != "" {
		// The same build on an embedded server, for docs/cluster.md's
		// number (same machine, same run).
		s := startServer(t)
		t0 := time.Now()
		_, est, _ := s.buildTemplate(t, "embedded-built", map[string]any{"fromTemplate": "base",
			"steps": []any{map[string]any{"type": "RUN", "args": []string{"echo built-on-embedded > /etc/cluster-build"}}}})
		if est.Status != "ready" {
			t.Fatalf("embedded build: %s %+v", est.Status, est.Reason)
		}
		emb := time.Since(t0)
		t.Logf("the same build embedded: %v (cluster/embedded %.2fx)", emb.Round(time.Millisecond), float64(took)/float64(emb))
		t0 = time.Now()
		_, est, _ = s.buildTemplate(t, "embedded-built-2", map[string]any{"fromTemplate": "base",
			"steps": []any{map[string]any{"type": "RUN", "args": []string{"echo second > /etc/cluster-build"}}}})
		if est.Status != "ready" {
			t.Fatalf("second embedded build: %s %+v", est.Status, est.Reason)
		}
		emb2 := time.Since(t0)
		t.Logf("the second build embedded: %v (cluster/embedded %.2fx)", emb2.Round(time.Millisecond), float64(took2)/float64(emb2))
	}
}
