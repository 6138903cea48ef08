package dataplane_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/cubicle-dev/cubicle/internal/clusterpki"
	"github.com/cubicle-dev/cubicle/internal/dataplane"
	"github.com/cubicle-dev/cubicle/internal/dataplane/dataplanetest"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodetest/localnode"
)

// volumeNode is a real node (node.Local with the local volume plugin)
// serving its data plane with the volume-content target, and the control
// plane's VolumeProxy to it behind a test HTTP server.
type volumeNode struct {
	l     *node.Local
	att   node.VolumeAttachment
	pki   *dataplanetest.PKI
	addr  string
	front *httptest.Server
}

func newVolumeNode(t *testing.T) *volumeNode {
	l, plugin := localnode.New(t)
	att := localnode.NewVolume(t, plugin)
	pki := dataplanetest.NewPKI(t)
	addr, _ := pki.Serve(t, "node-a", dataplane.ServerConfig{Lookup: dataplane.NodeLookup(l), Volumes: l})
	vp := dataplane.NewVolumeProxy(pki.Client(t), func(_ context.Context, id string) (string, error) {
		if id != "node-a" {
			return "", errors.New("unknown node")
		}
		return addr, nil
	})
	t.Cleanup(vp.Close)
	front := httptest.NewServer(vp.Handler("node-a"))
	t.Cleanup(front.Close)
	return &volumeNode{l: l, att: att, pki: pki, addr: addr, front: front}
}

func (v *volumeNode) do(t *testing.T, method, vol, res, path string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, v.front.URL+"/volumecontent/"+vol+"/"+res+"?path="+path, body)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer whatever")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestVolumeContentThroughNode: the node serves a volume's files over its
// data plane only while it holds the volume attached for the
// volume-content API, from the directory of its own attachment record,
// with the content handler's rules (a symlink escape is 403); a file
// written through it is in the attached directory.
func TestVolumeContentThroughNode(t *testing.T) {
	v := newVolumeNode(t)
	ctx := context.Background()
	vol := v.att.VolumeID

	if st, body := v.do(t, "PUT", vol, "file", "/a.txt", strings.NewReader("x")); st != http.StatusConflict || !strings.Contains(body, "not attached") {
		t.Fatalf("a volume not attached on the node: %d %s", st, body)
	}
	hp, err := v.l.AttachVolume(ctx, "volume-content", v.att)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.l.DetachVolume(context.Background(), "volume-content", vol) })

	if st, body := v.do(t, "PUT", vol, "file", "/a.txt", strings.NewReader("through the node")); st/100 != 2 {
		t.Fatalf("write: %d %s", st, body)
	}
	if b, err := os.ReadFile(filepath.Join(hp, "a.txt")); err != nil || string(b) != "through the node" {
		t.Fatalf("the file in the attached directory: %q, %v", b, err)
	}
	if st, body := v.do(t, "GET", vol, "file", "/a.txt", nil); st != http.StatusOK || body != "through the node" {
		t.Fatalf("read: %d %q", st, body)
	}
	if st, body := v.do(t, "GET", vol, "dir", "/", nil); st != http.StatusOK || !strings.Contains(body, `"name":"a.txt"`) {
		t.Fatalf("list: %d %s", st, body)
	}
	// A sandbox could plant this: the node's handler refuses to follow it.
	if err := os.Symlink("/etc", filepath.Join(hp, "esc")); err != nil {
		t.Fatal(err)
	}
	if st, body := v.do(t, "GET", vol, "file", "/esc/passwd", nil); st != http.StatusForbidden {
		t.Fatalf("a symlink escape: %d %s", st, body)
	}
	// Another volume ID, and one that is no volume name at all: refused,
	// never resolved to a path.
	for _, other := range []string{"othervol", "..", "a%2Fb"} {
		if st, body := v.do(t, "GET", other, "dir", "/", nil); st/100 == 2 {
			t.Fatalf("volume %q: %d %s", other, st, body)
		}
	}
	// Detached: no longer served.
	if err := v.l.DetachVolume(ctx, "volume-content", vol); err != nil {
		t.Fatal(err)
	}
	if st, body := v.do(t, "GET", vol, "file", "/a.txt", nil); st != http.StatusConflict {
		t.Fatalf("after the detach: %d %s", st, body)
	}
}

// TestVolumeTargetOnlyTheControlPlane: the volume-content target refuses
// another node's certificate and another cluster's control plane at the
// handshake, and a node without Volumes refuses the target.
func TestVolumeTargetOnlyTheControlPlane(t *testing.T) {
	v := newVolumeNode(t)
	ctx := context.Background()
	if _, err := v.l.AttachVolume(ctx, "volume-content", v.att); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.l.DetachVolume(context.Background(), "volume-content", v.att.VolumeID) })
	peer, err := dataplane.NewClient(v.pki.Node(t, "node-b"), v.pki.CA.Cert, v.pki.Store)
	if err != nil {
		t.Fatal(err)
	}
	if c, err := peer.DialVolumes(ctx, "node-a", v.addr); err == nil {
		c.Close()
		t.Fatal("a node's certificate reached the volume server")
	}
	other := dataplanetest.NewPKI(t)
	if c, err := other.Client(t).DialVolumes(ctx, "node-a", v.addr); err == nil {
		c.Close()
		t.Fatal("another cluster's control plane reached the volume server")
	}
	if _, err := v.pki.Client(t).DialVolumes(ctx, "node-b", v.addr); !errors.Is(err, clusterpki.ErrIdentity) {
		t.Fatalf("node-a answered as node-b: %v", err)
	}
	bare, _ := v.pki.Serve(t, "node-c", dataplane.ServerConfig{Lookup: dataplane.NodeLookup(v.l)})
	var te *dataplane.TunnelError
	if _, err := v.pki.Client(t).DialVolumes(ctx, "node-c", bare); !errors.As(err, &te) || te.Status != http.StatusNotFound || !errors.Is(err, dataplane.ErrBadTarget) {
		t.Fatalf("a node without volume content: %v", err)
	}
}

// TestVolumeContentStreamsBigFiles: 100 MB up and down through the proxy
// and the node, compared byte for byte.
func TestVolumeContentStreamsBigFiles(t *testing.T) {
	v := newVolumeNode(t)
	ctx := context.Background()
	hp, err := v.l.AttachVolume(ctx, "volume-content", v.att)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { v.l.DetachVolume(context.Background(), "volume-content", v.att.VolumeID) })
	data := bytes.Repeat([]byte("0123456789abcdef"), 100<<20/16)
	want := sha256.Sum256(data)
	// Everything (client, proxy, node) is in this process: what it
	// allocates for 100 MB each way shows that no side holds a body whole.
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	req, _ := http.NewRequest("PUT", v.front.URL+"/volumecontent/"+v.att.VolumeID+"/file?path=/big", bytes.NewReader(data))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("upload: %d", resp.StatusCode)
	}
	if fi, err := os.Stat(filepath.Join(hp, "big")); err != nil || fi.Size() != int64(len(data)) {
		t.Fatalf("uploaded file: %v %v", fi, err)
	}
	resp, err = http.Get(v.front.URL + "/volumecontent/" + v.att.VolumeID + "/file?path=/big")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	h := sha256.New()
	n, err := io.Copy(h, resp.Body)
	if err != nil || n != int64(len(data)) || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatalf("download: %d bytes, %v, hash equal %v", n, err, bytes.Equal(h.Sum(nil), want[:]))
	}
	runtime.ReadMemStats(&after)
	t.Logf("allocated %d MiB", (after.TotalAlloc-before.TotalAlloc)>>20)
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 40<<20 {
		t.Fatalf("200 MB through the proxy and the node allocated %d MiB: a body is buffered", alloc>>20)
	}
}

// TestVolumeTunnelsLeaveRoomForSandboxes: volume-content tunnels are
// opened for API requests that any team with a volume token can make
// (and hold, streaming a large file slowly), so they get a share of the
// node's tunnel limit, not all of it: past the share a volume tunnel is
// 503 (ErrBusy) while sandbox tunnels, every team's traffic to its
// sandboxes on this node, still open.
func TestVolumeTunnelsLeaveRoomForSandboxes(t *testing.T) {
	l, _ := localnode.New(t)
	port := rawSandbox(t, func(c *net.TCPConn) { io.Copy(c, c) })
	f := nodeA(t, dataplane.ServerConfig{MaxTunnels: 4, Volumes: l})
	ctx := context.Background()
	vols := 0
	for range 4 {
		c, err := f.cl.DialVolumes(ctx, "node-a", f.addr)
		if errors.Is(err, dataplane.ErrBusy) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		vols++
	}
	if vols == 4 {
		t.Fatal("volume-content tunnels took every tunnel of the node")
	}
	for i := range 4 - vols {
		c, err := f.cl.Dial(ctx, "node-a", f.addr, "sb1", port)
		if err != nil {
			t.Fatalf("sandbox tunnel %d with %d volume tunnels open: %v", i, vols, err)
		}
		defer c.Close()
	}
}
