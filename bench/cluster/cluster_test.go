// Package cluster_test measures create → first command through the cluster
// path (a pure control plane on PostgreSQL driving a `cubicle node run`
// over mTLS) against embedded `cubicle serve`, in one invocation.
//
//	make bench-cluster
//	go test -run '^$' -bench ClusterFirstCommand -benchtime 20x ./bench/cluster/
//
// Needs root, runc, PostgreSQL's binaries and the base image.
package cluster_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/internal/testenv/testcluster"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/process"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/process/processconnect"
)

var binDir, imagesDir string

// TestMain only stops what the benchmark started: `go test ./...` (make
// test) runs no benchmark, so it builds nothing and starts nothing.
func TestMain(m *testing.M) {
	code := pgtest.Main(m)
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

var buildOnce sync.Once

// build compiles cubicle and cubicle-agent into a temp dir, once.
func build(b *testing.B) {
	b.Helper()
	var err error
	buildOnce.Do(func() {
		if binDir, err = os.MkdirTemp("/var/tmp", "cubicle-bench-bin-"); err != nil {
			return
		}
		for _, bin := range []struct{ out, pkg, env string }{
			{"cubicle", "github.com/cubicle-dev/cubicle/cmd/cubicle", ""},
			{"cubicle-agent", "github.com/cubicle-dev/cubicle/cmd/cubicle-agent", "CGO_ENABLED=0"},
		} {
			cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, bin.out), bin.pkg)
			cmd.Env = os.Environ()
			if bin.env != "" {
				cmd.Env = append(cmd.Env, bin.env)
			}
			if out, berr := cmd.CombinedOutput(); berr != nil {
				err = fmt.Errorf("build %s: %v\n%s", bin.pkg, berr, out)
				return
			}
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	if _, serr := os.Stat(filepath.Join(binDir, "cubicle-agent")); serr != nil {
		b.Fatal("an earlier build failed")
	}
}

// newCluster starts a pure control plane on a fresh PostgreSQL database
// and one `cubicle node run` joined to it, everything on loopback
// (testcluster), and waits until the node is registered.
func newCluster(b *testing.B) *api {
	b.Helper()
	var cp *api
	testcluster.StartTB(b, testcluster.Options{
		Bin: filepath.Join(binDir, "cubicle"), AgentBin: filepath.Join(binDir, "cubicle-agent"), ImagesDir: imagesDir,
		Replicas: 1, Nodes: 1, DSN: pgtest.DSN(b), Domain: domain,
		// The embedded node admits sandboxes without CPU reservations; a
		// remote node is placed with them, so c=10 sandboxes of 2 CPUs on
		// a small host need the overcommit the embedded side has
		// implicitly.
		ReplicaArgs: []string{"--cpu-overcommit", "32"},
		NodeID:      func(int) string { return "bench-node" },
		Names:       testcluster.Names{Dir: "cubicle-bench-node-", Bridge: "cbb", Cgroup: "cubicle-bench-", Pool: "10.216"},
		// The control plane is this harness's api (HTTPS on --listen, where
		// the node joins too); its clean-up kills the node's sandboxes
		// through it before the node stops.
		Replica: func(_ int, args, _ []string) (string, error) {
			cp = newAPI(b, "control-plane", "", false, args...)
			return cp.listen, nil
		},
	})
	return cp
}

// sample is one create → first command: the whole, and its two hops.
type sample struct {
	total   time.Duration
	create  time.Duration // POST /sandboxes until its answer
	command time.Duration // the process Start of `true` until its stream ends
}

// firstCommand creates a base sandbox and runs `true` in it through the
// proxy (what the e2b SDK's create + commands.run does), timing the create
// request and the command's stream. The sandbox is killed afterwards,
// outside the measured time.
func firstCommand(ctx context.Context, a *api) (sample, error) {
	var zero sample
	t0 := time.Now()
	var sb struct {
		SandboxID       string `json:"sandboxID"`
		EnvdAccessToken string `json:"envdAccessToken"`
	}
	if _, err := a.do(ctx, "POST", "/sandboxes", map[string]any{"templateID": "base", "timeout": 300}, &sb); err != nil {
		return zero, err
	}
	t1 := time.Now()
	a.host.mu.Lock()
	a.host.seen[sb.SandboxID] = true
	a.host.mu.Unlock()
	defer a.do(context.Background(), "DELETE", "/sandboxes/"+sb.SandboxID, nil, nil)
	hc := &http.Client{Transport: envdHeaders{id: sb.SandboxID, token: sb.EnvdAccessToken, base: a.client.Transport}}
	pc := processconnect.NewProcessClient(hc, a.url(""), connect.WithProtoJSON())
	stdin := false
	stream, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "true"}},
		Stdin:   &stdin,
	}))
	if err != nil {
		return zero, err
	}
	defer stream.Close()
	code := int32(-1)
	for stream.Receive() {
		if e := stream.Msg().GetEvent().GetEnd(); e != nil {
			code = e.GetExitCode()
		}
	}
	if err := stream.Err(); err != nil {
		return zero, err
	}
	if code != 0 {
		return zero, fmt.Errorf("true exited %d", code)
	}
	t2 := time.Now()
	return sample{total: t2.Sub(t0), create: t1.Sub(t0), command: t2.Sub(t1)}, nil
}

// envdHeaders adds the routing and auth headers the SDK sends to envd.
type envdHeaders struct {
	id, token string
	base      http.RoundTripper
}

func (h envdHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", h.id)
	r.Header.Set("E2b-Sandbox-Port", "49983")
	r.Header.Set("X-Access-Token", h.token)
	return h.base.RoundTrip(r)
}

// round runs c first commands at once on a and appends their times.
func round(ctx context.Context, a *api, c int, into *[]sample) error {
	var mu sync.Mutex
	var firstErr error
	var wg sync.WaitGroup
	for range c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			d, err := firstCommand(ctx, a)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				if firstErr == nil {
					firstErr = err
				}
				return
			}
			*into = append(*into, d)
		}()
	}
	wg.Wait()
	return firstErr
}

// quantile is the p-quantile of one field of the samples.
func quantile(s []sample, field func(sample) time.Duration, p float64) time.Duration {
	d := make([]time.Duration, len(s))
	for i, x := range s {
		d[i] = field(x)
	}
	sort.Slice(d, func(i, j int) bool { return d[i] < d[j] })
	return d[int(p*float64(len(d)-1))]
}

func total(s sample) time.Duration   { return s.total }
func create(s sample) time.Duration  { return s.create }
func command(s sample) time.Duration { return s.command }

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// BenchmarkClusterFirstCommand measures create → first command on the
// embedded server and through the cluster, at c=1 and c=10: rounds of c
// concurrent samples, alternating the two sides, b.N samples each. It
// prints p50/p95/p99 of both and the p50 ratio cluster/embedded.
func BenchmarkClusterFirstCommand(b *testing.B) {
	testenv.RequireRoot(b, "runc, netns, nftables")
	imagesDir = os.Getenv("CUBICLE_IMAGES_DIR")
	if imagesDir == "" {
		imagesDir = "/var/lib/cubicle/images"
	}
	for _, bin := range []string{"runc", "nft", "ip"} {
		testenv.LookPath(b, bin)
	}
	if _, err := os.Stat(filepath.Join(imagesDir, "base", "rootfs", "bin", "bash")); err != nil {
		b.Fatalf("base image missing under %s (scripts/install): %v", imagesDir, err)
	}
	build(b)
	embedded := newAPI(b, "embedded", "", true)
	cluster := newCluster(b)
	ctx := context.Background()
	// One untimed sample each: the first create pays one-time costs (the
	// control plane's first dial of the node, the page cache).
	for _, a := range []*api{embedded, cluster} {
		if _, err := firstCommand(ctx, a); err != nil {
			b.Fatalf("%s warm-up: %v", a.name, err)
		}
	}
	for _, c := range []int{1, 10} {
		b.Run(fmt.Sprintf("c=%d", c), func(b *testing.B) {
			var emb, clu []sample
			for len(emb) < b.N || len(clu) < b.N {
				n := min(c, b.N-min(len(emb), len(clu)))
				if err := round(ctx, embedded, n, &emb); err != nil {
					b.Fatalf("embedded: %v", err)
				}
				if err := round(ctx, cluster, n, &clu); err != nil {
					b.Fatalf("cluster: %v", err)
				}
			}
			ratio := float64(quantile(clu, total, 0.5)) / float64(quantile(emb, total, 0.5))
			b.ReportMetric(ratio, "p50-ratio")
			if b.N < max(c, 2) {
				return // the framework's probe run
			}
			for _, side := range []struct {
				name string
				s    []sample
			}{{"embedded", emb}, {"cluster", clu}} {
				fmt.Printf("c=%-3d %-9s n=%3d  p50 %9s  p95 %9s  p99 %9s   (p50 create %9s, first command %9s)\n", c, side.name, len(side.s),
					ms(quantile(side.s, total, 0.5)), ms(quantile(side.s, total, 0.95)), ms(quantile(side.s, total, 0.99)),
					ms(quantile(side.s, create, 0.5)), ms(quantile(side.s, command, 0.5)))
			}
			fmt.Printf("c=%-3d p50 ratio cluster/embedded: %.2fx\n", c, ratio)
		})
	}
}
