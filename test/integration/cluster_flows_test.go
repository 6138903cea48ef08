package integration

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/cubicle-dev/cubicle/internal/accel/acceltest"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/volume/s3/s3test"
)

// TestCluster runs a cluster as three machines would: PostgreSQL, two
// control-plane replicas behind a TCP balancer, and three `cubicle node
// run` agents, each in its own network namespace. It checks placement
// without overselling, routing of the API and the data plane across
// replicas and nodes, node loss (SIGKILL, then a cut link) and its repair,
// and the failover of the leased loops when a replica dies.
func TestCluster(t *testing.T) {
	// Room for exactly ten sandboxes per node, by memory (CPU is
	// overcommitted enough not to bind).
	perSandbox := memTotalMiB(t) / 10
	// node-c alone has a (fake) GPU.
	acceltest.Skip(t)
	gpu := acceltest.NewHost(t, acceltest.GPU{Addr: gpuAddr, VendorID: "0x10de", DeviceID: "0x2330", Class: "0x030200", NUMA: 0,
		IOMMUGroup: 12, Driver: "nvidia", Minor: 0, Model: "NVIDIA H100 80GB HBM3", MemoryMB: 81559, UUID: "GPU-11111111-2222-3333-4444-555555555555"})
	for d := gpu.Root; d != "/" && d != "." && d != filepath.Clean(os.TempDir()); d = filepath.Dir(d) {
		os.Chmod(d, 0o755)
	}
	// Volumes are on S3 (versitygw), which every node reaches over the LAN
	// through a balancer in front of its loopback port.
	gw := requireS3(t)
	lan := newTestLAN(t)
	s3lb := startBalancer(t, lan.gw.String()+":0", []string{strings.TrimPrefix(gw.Endpoint, "http://")})
	stateDir := t.TempDir()
	nodeEnv := append(gw.Env(), "CUBICLE_S3_ENDPOINT=http://"+s3lb.addr, "CUBICLE_S3_STATE_DIR="+filepath.Join(stateDir, "nodes"))
	plugin := filepath.Join(binDir, "cubicle-volume-s3")
	volCfg := filepath.Join(stateDir, "control.yaml")
	os.WriteFile(volCfg, []byte(fmt.Sprintf("volume_plugins:\n  - name: s3\n    type: binary\n    binary_path: %s\n  - name: local\n    type: local\n", plugin)), 0o644)
	var bases []string
	t.Cleanup(func() {
		for _, b := range bases {
			s3test.CleanupMounts(t, b)
		}
	})
	// Snapshot packages go to the same S3 server, by presigned URLs the
	// nodes reach through the balancer.
	snapStore := "s3://" + gw.Bucket + "?endpoint=" + url.QueryEscape("http://"+s3lb.addr) + "&region=" + gw.Region + "&pathStyle=true&prefix=snapshots/"
	c := startCluster(t, 2, 3, clusterOptions{
		lan: lan,
		replicaEnv: append(gw.Env(), "CUBICLE_S3_STATE_DIR="+filepath.Join(stateDir, "cp"),
			"CUBICLE_SNAPSHOT_S3_ACCESS_KEY="+gw.AccessKey, "CUBICLE_SNAPSHOT_S3_SECRET_KEY="+gw.SecretKey),
		nodeEnv: nodeEnv,
		nodeConfig: func(data string) string {
			base := filepath.Join(data, "volume-mounts")
			bases = append(bases, base)
			return fmt.Sprintf("[storage]\n  volume_plugin_base_dir = %q\n[[storage.volume_plugins]]\n  name = \"s3\"\n  type = \"binary\"\n  binary_path = %q\n[[storage.volume_plugins]]\n  name = \"local\"\n  type = \"local\"\n", base, plugin)
		},
		replica: []string{"--volume-config", volCfg, "--snapshot-store", snapStore, "--cpu-count", "1", "--cpu-overcommit", "10", "--memory-mb", fmt.Sprint(perSandbox),
			"--node-lost-after", "12s", "--lease-poll", "500ms", "--volume-content-idle", "2s"},
		node: map[int][]string{2: {"--accel-sysfs", gpu.Sysfs, "--accel-dev", gpu.Dev, "--accel-proc", gpu.Proc,
			"--nvidia-smi", filepath.Join(gpu.Bin, "nvidia-smi"), "--accel-lib-dir", gpu.Lib, "--accel-bin-dir", gpu.Bin,
			"--accel-release-timeout", "3s"}},
	})
	r0, r1 := c.replicas[0], c.replicas[1]

	t.Run("50 creates on room for 30", func(t *testing.T) {
		var wg sync.WaitGroup
		var mu sync.Mutex
		var ids []string
		codes := map[int]int{}
		var badRetry []string
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := c.replicas[i%2]
				st, h, body, err := post(s, "/sandboxes", map[string]any{"templateID": "base", "timeout": 600})
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					codes[-1]++
					return
				}
				codes[st]++
				switch st {
				case http.StatusCreated:
					var cr created
					json.Unmarshal(body, &cr)
					ids = append(ids, cr.SandboxID)
					s.seen[cr.SandboxID] = true
				case http.StatusTooManyRequests:
					if h.Get("Retry-After") == "" {
						badRetry = append(badRetry, string(body))
					}
				default:
					badRetry = append(badRetry, fmt.Sprintf("%d %s", st, body))
				}
			}()
		}
		wg.Wait()
		if codes[http.StatusCreated] != 30 || codes[http.StatusTooManyRequests] != 20 || len(badRetry) > 0 {
			t.Fatalf("statuses %v (want 30×201, 20×429 with Retry-After); odd answers: %v", codes, badRetry)
		}
		perNode := map[string]int{}
		for _, id := range ids {
			perNode[c.row(id).Node]++
		}
		for _, n := range c.nodes {
			if perNode[n.ID] != 10 {
				t.Fatalf("sandboxes per node %v: want 10 on each (room for 10 each)", perNode)
			}
		}
		for i, id := range ids {
			if st := c.replicas[i%2].do("DELETE", "/sandboxes/"+id, nil, nil); st != http.StatusNoContent {
				t.Fatalf("kill %s: %d", id, st)
			}
		}
	})

	// one creates sandboxes through r0 until one lands on node (bounded).
	one := func(t *testing.T, node string) created {
		t.Helper()
		var extra []string
		defer func() {
			for _, id := range extra {
				r0.do("DELETE", "/sandboxes/"+id, nil, nil)
			}
		}()
		for range 6 {
			cr := r0.create(map[string]any{"templateID": "base", "timeout": 600})
			if c.row(cr.SandboxID).Node == node {
				return cr
			}
			extra = append(extra, cr.SandboxID)
		}
		t.Fatalf("no sandbox landed on %s in 6 creates", node)
		return created{}
	}

	t.Run("API and data plane across replicas and nodes", func(t *testing.T) {
		for _, n := range c.nodes {
			sb := one(t, n.ID)
			// Created through r0, used through r1: the proxy tunnels to the
			// node's data plane.
			if out := r1.mustRun(sb, "echo hello from $(hostname)"); !strings.HasPrefix(out, "hello from") {
				t.Fatalf("run on %s through the other replica: %q", n.ID, out)
			}
			if n.ID != "node-a" {
				r0.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, nil)
				continue
			}
			// 100 MB each way through the tunnel, byte-exact.
			big := filepath.Join(t.TempDir(), "big")
			data := make([]byte, 100<<20)
			for i := range data {
				data[i] = byte(i * 7 % 251)
			}
			if err := os.WriteFile(big, data, 0o644); err != nil {
				t.Fatal(err)
			}
			want := sha256.Sum256(data)
			r1.upload(t, sb, big, "/tmp/up")
			if out := r1.mustRun(sb, "sha256sum /tmp/up | cut -d' ' -f1"); strings.TrimSpace(out) != hex.EncodeToString(want[:]) {
				t.Fatalf("uploaded file's hash in the sandbox: %q", out)
			}
			req, _ := http.NewRequest("GET", r0.URL+"/files?path=/tmp/up&username=user", nil)
			resp, err := r0.envdClient(sb).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			h := sha256.New()
			nb, _ := io.Copy(h, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK || !bytes.Equal(h.Sum(nil), want[:]) {
				t.Fatalf("download: status %d, %d bytes, hash mismatch", resp.StatusCode, nb)
			}
			r0.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, nil)
		}
	})

	t.Run("GPU requests land on the node with the GPU", func(t *testing.T) {
		gpuReq := map[string]any{"templateID": "base", "accelerators": []map[string]any{{"class": "gpu", "count": 1}}}
		sb := r1.create(gpuReq)
		if on := c.row(sb.SandboxID).Node; on != "node-c" {
			t.Fatalf("GPU sandbox on %s, want node-c (the only one with a GPU)", on)
		}
		if out := r0.mustRun(sb, "echo vis=$NVIDIA_VISIBLE_DEVICES"); !strings.Contains(out, "vis=GPU-11111111") {
			t.Fatalf("GPU sandbox env: %q", out)
		}
		// The cluster's only GPU is taken: no capacity; a contract no node
		// can meet is 400 naming the layer.
		errShape(t, r0, "POST", "/v2/sandboxes", gpuReq, http.StatusTooManyRequests)
		errShape(t, r0, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "accelerators": []map[string]any{{"class": "gpu", "count": 1, "labels": map[string]string{"vendor": "amd"}}}}, http.StatusBadRequest)
		errShape(t, r1, "POST", "/v2/sandboxes", map[string]any{"templateID": "base", "accelerators": []map[string]any{{"class": "tpu", "count": 1}}}, http.StatusBadRequest)
		r0.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, nil)
	})

	t.Run("a volume used on two nodes", func(t *testing.T) {
		v := r0.createVolume(t, map[string]any{"name": "shared-" + c.lan.suffix})
		if v.Driver != "s3" {
			t.Fatalf("volume driver %q, want s3 (the shared backend)", v.Driver)
		}
		mount := map[string]any{"templateID": "base", "timeout": 600, "volumeMounts": []any{map[string]any{"name": v.VolumeID, "path": "/data"}}}
		onNode := func(node string) created {
			var extra []string
			defer func() {
				for _, id := range extra {
					r0.do("DELETE", "/sandboxes/"+id, nil, nil)
				}
			}()
			for range 6 {
				cr := r0.create(mount)
				if c.row(cr.SandboxID).Node == node {
					return cr
				}
				extra = append(extra, cr.SandboxID)
			}
			t.Fatalf("no sandbox with the volume landed on %s", node)
			return created{}
		}
		a, b := onNode("node-a"), onNode("node-b")
		if got := r1.volume(t, v.VolumeID); len(got.Attachments) != 2 {
			t.Fatalf("attachments across two nodes: %+v", got.Attachments)
		}
		r0.mustRun(a, "echo from-a > /data/a")
		waitFor(t, "node-b's sandbox sees node-a's write", 30*time.Second, func() (bool, string) {
			out, _, _, _ := r1.run(b, "cat /data/a 2>&1")
			return out == "from-a\n", out
		})
		errShape(t, r1, "DELETE", "/volumes/"+v.VolumeID, nil, http.StatusConflict)
		r0.do("DELETE", "/sandboxes/"+a.SandboxID, nil, nil)
		errShape(t, r0, "DELETE", "/volumes/"+v.VolumeID, nil, http.StatusConflict)
		r1.do("DELETE", "/sandboxes/"+b.SandboxID, nil, nil)
		if got := r0.volume(t, v.VolumeID); len(got.Attachments) != 0 {
			t.Fatalf("attachments after both kills: %+v", got.Attachments)
		}
		if st := r0.do("DELETE", "/volumes/"+v.VolumeID, nil, nil); st != http.StatusNoContent {
			t.Fatalf("delete the volume once no node holds it: %d", st)
		}
	})

	t.Run("the volume-content API through the volume's node", func(t *testing.T) {
		v := r0.createVolume(t, map[string]any{"name": "files-" + c.lan.suffix})
		contentRefs := func() []string {
			var out []string
			for _, n := range c.nodes {
				filepath.Walk(filepath.Join(n.DataDir, "node", "volumes", v.VolumeID), func(p string, fi os.FileInfo, err error) error {
					if err == nil && !fi.IsDir() {
						out = append(out, n.ID+":"+p)
					}
					return nil
				})
			}
			return out
		}
		// A wrong token is refused by the control plane: no node attaches.
		if st, _ := contentReq(t, r0, "PUT", "/volumecontent/"+v.VolumeID+"/file?path=/hello.txt", "wrong", strings.NewReader("x")); st != http.StatusUnauthorized {
			t.Fatalf("wrong token: %d", st)
		}
		if refs := contentRefs(); len(refs) != 0 {
			t.Fatalf("a refused request attached the volume: %v", refs)
		}
		// Written through one replica, read through both (the pure control
		// planes have no node: each leases the volume on a node and
		// proxies to that node's data plane).
		if st, body := contentReq(t, r0, "PUT", "/volumecontent/"+v.VolumeID+"/file?path=/hello.txt", v.Token, strings.NewReader("through a node")); st != http.StatusCreated {
			t.Fatalf("write: %d %s", st, body)
		}
		for _, r := range []*server{r0, r1} {
			if st, body := contentReq(t, r, "GET", "/volumecontent/"+v.VolumeID+"/file?path=/hello.txt", v.Token, nil); st != http.StatusOK || body != "through a node" {
				t.Fatalf("read: %d %q", st, body)
			}
		}
		// A sandbox that mounts the volume reads it; a symlink it plants
		// is refused by the node's handler.
		sb := r0.create(map[string]any{"templateID": "base", "timeout": 600, "volumeMounts": []any{map[string]any{"name": v.VolumeID, "path": "/data"}}})
		waitFor(t, "the sandbox sees the file written through the API", 30*time.Second, func() (bool, string) {
			out, _, _, _ := r1.run(sb, "cat /data/hello.txt 2>&1")
			return out == "through a node", out
		})
		r1.mustRun(sb, "ln -s /etc /data/esc")
		waitFor(t, "the symlink escape is refused", 30*time.Second, func() (bool, string) {
			st, body := contentReq(t, r0, "GET", "/volumecontent/"+v.VolumeID+"/file?path=/esc/passwd", v.Token, nil)
			return st == http.StatusForbidden, fmt.Sprintf("%d %s", st, body)
		})
		r0.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, nil)
		// Both replicas' leases end after the idle period: no node holds
		// the volume any more, and it can be deleted.
		waitFor(t, "the content leases are detached", 30*time.Second, func() (bool, string) {
			refs := contentRefs()
			return len(refs) == 0, strings.Join(refs, " ")
		})
		if st := r1.do("DELETE", "/volumes/"+v.VolumeID, nil, nil); st != http.StatusNoContent {
			t.Fatalf("delete the volume: %d", st)
		}
	})

	t.Run("a snapshot taken on one node restores on another", func(t *testing.T) {
		src := one(t, "node-a")
		r0.mustRun(src, "echo kept > /home/user/state")
		sn := r1.snapshotOf(t, src, "")
		r0.do("DELETE", "/sandboxes/"+src.SandboxID, nil, nil)
		// node-a may take no new sandboxes: the restore must go elsewhere.
		if out, err := cubicleCLI("node", "cordon", "node-a", "--store", c.dsn); err != nil {
			t.Fatalf("cordon: %v\n%s", err, out)
		}
		defer cubicleCLI("node", "uncordon", "node-a", "--store", c.dsn)
		from := r1.create(map[string]any{"templateID": sn.SnapshotID, "timeout": 600})
		if on := c.row(from.SandboxID).Node; on == "node-a" {
			t.Fatalf("the create from the snapshot went to the cordoned node")
		}
		if out := r0.mustRun(from, "cat /home/user/state"); out != "kept\n" {
			t.Fatalf("restored on another node: %q", out)
		}
		r0.do("DELETE", "/sandboxes/"+from.SandboxID, nil, nil)
		r0.do("DELETE", "/templates/"+sn.SnapshotID, nil, nil)
	})

	t.Run("SIGKILL a node: lost, avoided, re-adopted", func(t *testing.T) {
		n := c.nodes[2]
		sb := one(t, n.ID)
		r0.mustRun(sb, "echo kept > /tmp/state")
		c.stopNode(n, 9)
		c.waitState(sb.SandboxID, store.StateLost, 60*time.Second)
		for range 4 {
			cr := r1.create(map[string]any{"templateID": "base", "timeout": 600})
			if on := c.row(cr.SandboxID).Node; on == n.ID {
				t.Fatalf("a create went to the lost node %s", on)
			}
			r1.do("DELETE", "/sandboxes/"+cr.SandboxID, nil, nil)
		}
		c.startNode(n)
		c.waitState(sb.SandboxID, store.StateRunning, 60*time.Second)
		if out := r1.mustRun(sb, "cat /tmp/state"); out != "kept\n" {
			t.Fatalf("re-adopted sandbox: %q", out)
		}
		r0.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, nil)
	})

	t.Run("cut a node's link, then restore it", func(t *testing.T) {
		n := c.nodes[1]
		sb := one(t, n.ID)
		mustIP(t, "-n", n.NS, "link", "set", "eth0", "down")
		c.waitState(sb.SandboxID, store.StateLost, 60*time.Second)
		mustIP(t, "-n", n.NS, "link", "set", "eth0", "up")
		mustIP(t, "-n", n.NS, "route", "replace", "default", "via", c.lan.gw.String())
		c.waitState(sb.SandboxID, store.StateRunning, 60*time.Second)
		if out := r0.mustRun(sb, "echo back"); out != "back\n" {
			t.Fatalf("after the link came back: %q", out)
		}
		r0.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, nil)
	})

	t.Run("a paused sandbox of a SIGKILLed node resumes on another", func(t *testing.T) {
		n := c.nodes[0]
		sb := one(t, n.ID)
		r0.mustRun(sb, "echo kept > /home/user/state")
		start := time.Now()
		if st := r0.do("POST", "/sandboxes/"+sb.SandboxID+"/pause", map[string]any{"memory": false}, nil); st != http.StatusNoContent {
			t.Fatalf("filesystem pause: %d", st)
		}
		t.Logf("filesystem pause with its package pushed: %s", time.Since(start).Round(time.Millisecond))
		if pp := c.row(sb.SandboxID).PausePackage; pp == nil {
			t.Fatalf("no pause package after the pause")
		}
		c.stopNode(n, 9)
		c.waitState(sb.SandboxID, store.StateLost, 60*time.Second)
		start = time.Now()
		if st := r1.do("POST", "/sandboxes/"+sb.SandboxID+"/connect", map[string]any{"timeout": 600}, nil); st != http.StatusCreated {
			t.Fatalf("connect to the lost paused sandbox: %d", st)
		}
		t.Logf("resume on another node (fetch + boot): %s", time.Since(start).Round(time.Millisecond))
		if on := c.row(sb.SandboxID).Node; on == n.ID {
			t.Fatalf("resumed on the lost node %s", on)
		}
		if out := r0.mustRun(sb, "cat /home/user/state"); out != "kept\n" {
			t.Fatalf("files written before the pause, on the new node: %q", out)
		}
		// Back, node-a holds a leftover: the node-loss pass that sees it
		// return deletes it (its row names another node).
		c.startNode(n)
		c.waitNode(n, func(r *store.Node) bool { return time.Since(r.HeartbeatAt) < 5*time.Second })
		waitFor(t, "node-a's copy of the moved sandbox removed", 60*time.Second, func() (bool, string) {
			_, err := os.Stat(filepath.Join(n.DataDir, "sandboxes", sb.SandboxID))
			return os.IsNotExist(err), fmt.Sprint(err)
		})
		// Both replicas reach node-a again before the next subtest.
		for _, s := range c.replicas {
			waitFor(t, "the replica reaches node-a", 60*time.Second, func() (bool, string) {
				var nodes []struct {
					NodeID, Error string
				}
				s.do("GET", "/nodes", nil, &nodes)
				for _, nd := range nodes {
					if nd.NodeID == n.ID {
						return nd.Error == "", nd.Error
					}
				}
				return false, "not listed"
			})
		}
		if out := r1.mustRun(sb, "cat /home/user/state"); out != "kept\n" {
			t.Fatalf("after node-a returned: %q", out)
		}
		r0.do("DELETE", "/sandboxes/"+sb.SandboxID, nil, nil)
	})

	t.Run("SIGKILL the replica holding the reaper: the other reaps", func(t *testing.T) {
		holder := c.leaseHolder(t, "loop/reaper")
		var dead, alive *server
		for _, s := range c.replicas {
			if s.cmd != nil && s.cmd.Process.Pid == holder {
				dead = s
			} else {
				alive = s
			}
		}
		if dead == nil {
			t.Fatalf("no replica holds the reaper's lease (holder pid %d)", holder)
		}
		kill9(dead)
		cr := alive.create(map[string]any{"templateID": "base", "timeout": 3})
		c.waitState(cr.SandboxID, store.StateKilled, 30*time.Second)
		if st := alive.do("GET", "/sandboxes/"+cr.SandboxID, nil, nil); st != http.StatusNotFound {
			t.Fatalf("reaped sandbox: GET %d, want 404", st)
		}
	})
}

// post sends a JSON request without failing the test (for goroutines).
func post(s *server, path string, body any) (int, http.Header, []byte, error) {
	b, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", s.URL+path, bytes.NewReader(b))
	req.Header.Set("X-API-Key", s.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, raw, nil
}

// leaseHolder is the PID of the replica holding a leased loop's lease:
// its connection's application_name names the holder (host/pid/random).
func (c *cluster) leaseHolder(t *testing.T, lease string) int {
	t.Helper()
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, c.dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		var app string
		err := conn.QueryRow(ctx, `SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
			WHERE l.locktype = 'advisory' AND l.granted AND a.application_name LIKE '%' || $1`, " "+lease).Scan(&app)
		if err == nil {
			// "cubicle <host>/<pid>/<random> <lease>"
			f := strings.Fields(app)
			if len(f) == 3 {
				parts := strings.Split(f[1], "/")
				if len(parts) >= 2 {
					var pid int
					fmt.Sscan(parts[len(parts)-2], &pid)
					return pid
				}
			}
			t.Fatalf("lease connection %q: not cubicle <holder> <lease>", app)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("nobody holds %s", lease)
	return 0
}
