package cluster_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/servecert"
	"github.com/cubicle-dev/cubicle/internal/testenv/testcluster"
)

// domain is what both servers answer on: the same TLS API in front of
// both sides, so the only difference measured is where the node is.
const domain = "cubicle.test"

// proc is one cubicle process the bench started: its data dir and, for a
// process that runs sandboxes, the host resources it owns.
type proc struct {
	b       testing.TB
	name    string
	dataDir string
	host    *testcluster.Host // nil for a pure control plane
	args    []string
	cmd     *exec.Cmd
	exited  chan struct{}
	logs    *bytes.Buffer
	mu      sync.Mutex
	seen    map[string]bool // sandbox IDs, for their veths at clean-up
}

// newProc makes a data dir and registers the clean-up before anything
// starts, so a process that fails to start is still cleaned up.
func newProc(b testing.TB, name string, withHost bool) *proc {
	b.Helper()
	p := &proc{b: b, name: name, seen: map[string]bool{}}
	if withHost {
		h, err := testcluster.NewHost(name, "cubicle-bench-"+name+"-", "cbb", "cubicle-bench-")
		if err != nil {
			b.Fatal(err)
		}
		p.host, p.dataDir = h, h.DataDir
	} else {
		dir, err := os.MkdirTemp("/var/tmp", "cubicle-bench-"+name+"-")
		if err != nil {
			b.Fatal(err)
		}
		p.dataDir = dir
	}
	b.Cleanup(p.destroy)
	return p
}

// hostArgs are the node-side flags that keep this process's sandboxes on
// resources of its own.
func (p *proc) hostArgs() []string {
	pool, err := testcluster.FreePool("10.216")
	if err != nil {
		p.b.Fatal(err)
	}
	return []string{"--images-dir", imagesDir, "--bridge", p.host.Bridge, "--pool", pool,
		"--cgroup-parent", p.host.Cgroup, "--agent-bin", filepath.Join(binDir, "cubicle-agent"), "--lxcfs=false"}
}

func (p *proc) start() {
	p.b.Helper()
	p.logs = &bytes.Buffer{}
	p.cmd = exec.Command(filepath.Join(binDir, "cubicle"), p.args...)
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		p.b.Fatal(err)
	}
	p.exited = make(chan struct{})
	go func() { p.cmd.Wait(); close(p.exited) }()
}

func (p *proc) running() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// stop sends SIGTERM and, after 20 s, SIGKILL, to the process by its PID.
func (p *proc) stop() {
	if p.cmd == nil {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		p.cmd.Process.Kill()
		<-p.exited
	}
	p.cmd = nil
}

// destroy stops the process and removes everything it made
// (testcluster.Host.Clean: containers, veths, cgroups, the bridge, nft
// tables, mounts and the data dir). It fails the bench if anything is left.
func (p *proc) destroy() {
	p.stop()
	var left []string
	if p.host != nil {
		for id := range p.seen {
			h := sha256.Sum256([]byte(id))
			exec.Command("ip", "link", "del", "cbv"+hex.EncodeToString(h[:4])).Run()
		}
		left = p.host.Clean()
	} else {
		testcluster.UnmountUnder(p.dataDir)
		os.RemoveAll(p.dataDir)
		if _, err := os.Stat(p.dataDir); err == nil {
			left = append(left, "dir "+p.dataDir)
		}
	}
	if len(left) > 0 {
		p.b.Errorf("%s left host state behind:\n  %s", p.name, strings.Join(left, "\n  "))
	}
	if p.b.Failed() && p.logs != nil {
		p.b.Logf("%s logs:\n%s", p.name, p.logs)
	}
}

// freeListenAddr is testcluster.FreeListenAddr.
func freeListenAddr(b testing.TB) string {
	b.Helper()
	addr, err := testcluster.FreeListenAddr()
	if err != nil {
		b.Fatal(err)
	}
	return addr
}

// api is a `cubicle serve` as the SDK sees it: HTTPS on api.<domain>,
// dialled on the server's loopback port, with an API key.
type api struct {
	*proc
	listen string
	key    string
	client *http.Client
	// host is the process whose host the sandboxes run on (the node's
	// for a pure control plane): their veths are cleaned up there.
	host *proc
}

// newAPI starts `cubicle serve --tls-self-signed` with extra flags. store
// is "" for the data dir's SQLite, else a PostgreSQL DSN.
func newAPI(b testing.TB, name, store string, withHost bool, extra ...string) *api {
	b.Helper()
	a := &api{proc: newProc(b, name, withHost), listen: freeListenAddr(b)}
	a.host = a.proc
	for i, arg := range extra {
		if arg == "--store" && i+1 < len(extra) {
			store = extra[i+1] // a cluster replica's, from testcluster
		}
	}
	keyArgs := []string{"apikey", "create", "--data-dir", a.dataDir}
	if store != "" {
		keyArgs = append(keyArgs, "--store", store)
	}
	out, err := exec.Command(filepath.Join(binDir, "cubicle"), keyArgs...).Output()
	if err != nil {
		b.Fatalf("apikey create: %v", err)
	}
	a.key = strings.TrimSpace(string(out))
	_, caPath, err := servecert.SelfSigned(filepath.Join(a.dataDir, "tls"), domain)
	if err != nil {
		b.Fatal(err)
	}
	pemCA, err := os.ReadFile(caPath)
	if err != nil {
		b.Fatal(err)
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(pemCA)
	a.client = &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{
		TLSClientConfig:     &tls.Config{RootCAs: roots},
		MaxIdleConnsPerHost: 64,
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, a.listen)
		},
	}}
	a.args = []string{"serve", "--data-dir", a.dataDir, "--listen", a.listen, "--metrics-listen", freeListenAddr(b),
		"--domain", domain, "--tls-self-signed", "--images-dir", imagesDir}
	if store != "" && !slices.Contains(extra, "--store") {
		a.args = append(a.args, "--store", store)
	}
	if withHost {
		a.args = append(a.args, a.hostArgs()[2:]...) // --images-dir is already there
	}
	a.args = append(a.args, extra...)
	a.start()
	for deadline := time.Now().Add(60 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if resp, err := a.client.Get(a.url("/health")); err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				b.Cleanup(a.killAll) // runs before the process's own clean-up
				return a
			}
		}
		if !a.running() {
			break
		}
	}
	b.Fatalf("%s did not become healthy; logs:\n%s", name, a.logs)
	return nil
}

func (a *api) url(path string) string { return "https://api." + domain + path }

// do sends a JSON request with the API key and decodes a JSON answer.
func (a *api) do(ctx context.Context, method, path string, body, out any) (int, error) {
	var rd io.Reader
	if body != nil {
		raw, _ := json.Marshal(body)
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, a.url(path), rd)
	if err != nil {
		return 0, err
	}
	req.Header.Set("X-API-Key", a.key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := a.client.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if resp.StatusCode/100 != 2 {
		return resp.StatusCode, fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(raw))
	}
	if out != nil && len(raw) > 0 {
		return resp.StatusCode, json.Unmarshal(raw, out)
	}
	return resp.StatusCode, nil
}

// killAll deletes every sandbox the server still lists, so the node's
// own stop (which leaves sandboxes for re-adoption) leaves none.
func (a *api) killAll() {
	if !a.running() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var list []struct {
		SandboxID string `json:"sandboxID"`
	}
	if _, err := a.do(ctx, "GET", "/v2/sandboxes", nil, &list); err != nil {
		a.b.Errorf("%s: list sandboxes at clean-up: %v", a.name, err)
		return
	}
	for _, sb := range list {
		a.host.seen[sb.SandboxID] = true
		if _, err := a.do(ctx, "DELETE", "/sandboxes/"+sb.SandboxID, nil, nil); err != nil {
			a.b.Errorf("%s: kill %s at clean-up: %v", a.name, sb.SandboxID, err)
		}
	}
}
