// Package integration drives a real `cubicle serve` (real runc, netns,
// nftables, SQLite and agent) over HTTP, as a user would.
package integration

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
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
	"syscall"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/cubicle-dev/cubicle/internal/servecert"
	"github.com/cubicle-dev/cubicle/internal/testenv"
	"github.com/cubicle-dev/cubicle/internal/testenv/testcluster"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/process"
	"github.com/cubicle-dev/cubicle/sdk/go/envd/process/processconnect"
)

var binDir string

func TestMain(m *testing.M) {
	if os.Geteuid() != 0 {
		// Under CI=true a run that tested nothing must not pass.
		fmt.Println("integration tests need root (runc, netns, nftables)")
		if testenv.CI() {
			os.Exit(1)
		}
		os.Exit(0)
	}
	dir, err := os.MkdirTemp("/var/tmp", "cubicle-it-bin-")
	if err != nil {
		panic(err)
	}
	binDir = dir
	build := func(env []string, out, pkg string) {
		cmd := exec.Command("go", "build", "-o", filepath.Join(dir, out), pkg)
		cmd.Env = append(os.Environ(), env...)
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Println("build", pkg, err)
			os.RemoveAll(dir)
			os.Exit(1)
		}
	}
	build(nil, "cubicle", "github.com/cubicle-dev/cubicle/cmd/cubicle")
	build([]string{"CGO_ENABLED=0"}, "cubicle-agent", "github.com/cubicle-dev/cubicle/cmd/cubicle-agent")
	build(nil, "cubicle-volume-s3", "github.com/cubicle-dev/cubicle/cmd/cubicle-volume-s3")
	// Template builds need buildkitd next to cubicle. `make build` makes it
	// (minutes cold), so reuse that one when it is there.
	if bk, err := filepath.Abs("../../bin/buildkitd"); err == nil {
		if _, err := os.Stat(bk); err == nil {
			os.Symlink(bk, filepath.Join(dir, "buildkitd"))
		} else {
			build([]string{"CGO_ENABLED=0"}, "buildkitd", "github.com/moby/buildkit/cmd/buildkitd")
		}
	}
	imgs := os.Getenv("CUBICLE_IMAGES_DIR")
	if imgs == "" {
		imgs = "/var/lib/cubicle/images"
	}
	before := imagesDirEntries(imgs)
	code := m.Run()
	os.RemoveAll(dir)
	// The images dir is shared by every server of the run (and by the
	// developer's own): a server or node that writes its state there (a
	// pulled image, an unpacked reference) leaks it past the test.
	for _, e := range imagesDirEntries(imgs) {
		if !slices.Contains(before, e) {
			fmt.Printf("left in the shared images dir by the tests: %s\n", filepath.Join(imgs, e))
			code = 1
		}
	}
	os.Exit(code)
}

// imagesDirEntries lists dir two levels deep (each image and what is next
// to its rootfs), not inside any rootfs.
func imagesDirEntries(dir string) []string {
	var out []string
	top, _ := os.ReadDir(dir)
	for _, e := range top {
		out = append(out, e.Name())
		if !e.IsDir() {
			continue
		}
		sub, _ := os.ReadDir(filepath.Join(dir, e.Name()))
		for _, f := range sub {
			out = append(out, filepath.Join(e.Name(), f.Name()))
		}
	}
	return out
}

func imagesDir(t testing.TB) string {
	d := os.Getenv("CUBICLE_IMAGES_DIR")
	if d == "" {
		d = "/var/lib/cubicle/images"
	}
	if _, err := os.Stat(filepath.Join(d, "base", "rootfs", "bin", "bash")); err != nil {
		t.Fatalf("base image missing under %s (run scripts/install or scripts/build-rootfs): %v", d, err)
	}
	return d
}

// server is one `cubicle serve` process with its own data dir, bridge,
// address pool, nft table and cgroup parent.
type server struct {
	t       testing.TB
	DataDir string
	URL     string
	// MetricsURL is the --metrics-listen listener's base URL.
	MetricsURL string
	Key        string
	Bridge     string
	Cgroup     string
	args       []string
	env        []string // extra environment (binary volume plugins inherit it)
	cmd        *exec.Cmd
	logs       *bytes.Buffer
	client     *http.Client
	listenOn   string
	// lastHeader is the header of the latest response from do.
	lastHeader http.Header
	// seen holds every sandbox ID the harness created or listed, for the
	// leak check (their host veths must be gone).
	seen map[string]bool
}

// freePool picks a 10.213.X.0/24 no interface on the host uses (another
// suite, or a leftover of a crashed run, may hold one).
func freePool() string {
	p, err := testcluster.FreePool("10.213")
	if err != nil {
		panic(err)
	}
	return p
}

func startServer(t testing.TB, extra ...string) *server {
	t.Helper()
	return startServerEnv(t, nil, extra...)
}

func startServerEnv(t testing.TB, env []string, extra ...string) *server {
	t.Helper()
	s := newServer(t, env, extra...)
	s.start()
	return s
}

// newServer prepares a server (data dir, API key, arguments) without
// starting it, registering its clean-up.
func newServer(t testing.TB, env []string, extra ...string) *server {
	t.Helper()
	data, err := os.MkdirTemp("/var/tmp", "cubicle-it-data-")
	if err != nil {
		t.Fatal(err)
	}
	b := make([]byte, 3)
	rand.Read(b)
	suffix := hex.EncodeToString(b)
	s := &server{t: t, DataDir: data, Bridge: "cbi" + suffix, Cgroup: "cubicle-it-" + suffix, client: &http.Client{Timeout: 2 * time.Minute}, env: env, seen: map[string]bool{}}
	keyArgs := []string{"apikey", "create", "--data-dir", data}
	for i, a := range extra {
		if a == "--store" && i+1 < len(extra) {
			// The key goes where serve will look for it.
			keyArgs = append(keyArgs, "--store", extra[i+1])
		}
	}
	out, err := exec.Command(filepath.Join(binDir, "cubicle"), keyArgs...).Output()
	if err != nil {
		t.Fatalf("apikey create: %v", err)
	}
	s.Key = strings.TrimSpace(string(out))
	s.listenOn = freeListenAddr(t)
	s.URL = "http://" + s.listenOn
	metricsOn := freeListenAddr(t)
	for metricsOn == s.listenOn {
		metricsOn = freeListenAddr(t)
	}
	s.MetricsURL = "http://" + metricsOn
	s.args = []string{"serve", "--data-dir", data, "--listen", s.listenOn, "--metrics-listen", metricsOn, "--images-dir", imagesDir(t),
		"--bridge", s.Bridge, "--pool", freePool(),
		"--cgroup-parent", s.Cgroup, "--agent-bin", filepath.Join(binDir, "cubicle-agent"), "--memory-mb", "256"}
	s.args = append(s.args, extra...)
	// Registered first: a server that fails to start must still be cleaned up.
	t.Cleanup(s.destroy)
	return s
}

func (s *server) start() {
	s.t.Helper()
	s.logs = &bytes.Buffer{}
	s.cmd = s.command()
	s.cmd.Env = append(os.Environ(), s.env...)
	s.cmd.Stdout, s.cmd.Stderr = s.logs, s.logs
	if err := s.cmd.Start(); err != nil {
		s.t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := s.client.Get(s.URL + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				return
			}
		}
		if s.cmd.ProcessState != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.t.Fatalf("server did not become healthy; logs:\n%s", s.logs)
}

// command is the server's `cubicle serve` command line.
func (s *server) command() *exec.Cmd {
	return exec.Command(filepath.Join(binDir, "cubicle"), s.args...)
}

// stop ends the server process (sandboxes keep running, as on a restart).
func (s *server) stop(sig syscall.Signal) {
	if s.cmd == nil || s.cmd.Process == nil {
		return
	}
	s.cmd.Process.Signal(sig)
	done := make(chan struct{})
	go func() { s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		s.cmd.Process.Kill()
		<-done
	}
	s.cmd = nil
}

// destroy kills every sandbox through the API, stops the server and
// removes the bridge, nft table and data dir it created. It fails the test
// if the killed sandboxes left anything on the host (containers, netns,
// veths, cgroups, mounts) or if anything of the server's survives the clean-up.
func (s *server) destroy() {
	var leaks []string
	if s.cmd != nil {
		var list []map[string]any
		if s.do("GET", "/v2/sandboxes", nil, &list) == 200 {
			for _, sb := range list {
				id := sb["sandboxID"].(string)
				s.seen[id] = true
				s.do("DELETE", "/sandboxes/"+id, nil, nil)
			}
		}
		s.waitNoContainers(15 * time.Second)
		s.stop(syscall.SIGTERM)
		leaks = s.sandboxLeftovers()
	}
	s.forceClean()
	exec.Command("ip", "link", "del", s.Bridge).Run()
	exec.Command("nft", "delete", "table", "inet", "cubicle_"+s.Bridge).Run()
	exec.Command("nft", "delete", "table", "bridge", "cubicle_"+s.Bridge).Run()
	for _, ctrl := range []string{"cpu", "cpuacct", "memory", "pids", "freezer", "devices", "blkio", "cpuset", "systemd", "unified"} {
		os.Remove(filepath.Join("/sys/fs/cgroup", ctrl, s.Cgroup))
	}
	unmountUnder(s.DataDir)
	unmountUnder(filepath.Join("/run/cubicle", s.Bridge))
	os.RemoveAll(filepath.Join("/run/cubicle", s.Bridge))
	os.RemoveAll(s.DataDir)
	leaks = append(leaks, s.infraLeftovers()...)
	if len(leaks) > 0 {
		s.t.Errorf("server %s left host state behind:\n  %s", s.Bridge, strings.Join(leaks, "\n  "))
	}
	if s.t.Failed() {
		s.t.Logf("server logs:\n%s", s.logs)
	}
}

// do sends a JSON API request and decodes the response into out.
func (s *server) do(method, path string, body any, out any) int {
	s.t.Helper()
	st, h, raw := s.raw(method, path, body)
	s.lastHeader = h
	if out != nil && len(raw) > 0 {
		if err := json.Unmarshal(raw, out); err != nil {
			s.t.Fatalf("%s %s: decode %q: %v", method, path, raw, err)
		}
	}
	return st
}

// raw sends a request with the server's key (a string body is sent as is,
// anything else as JSON) and returns status, headers and body.
func (s *server) raw(method, path string, body any) (int, http.Header, []byte) {
	s.t.Helper()
	var rd io.Reader
	if body != nil {
		if raw, ok := body.(string); ok {
			rd = strings.NewReader(raw)
		} else {
			b, _ := json.Marshal(body)
			rd = bytes.NewReader(b)
		}
	}
	req, _ := http.NewRequest(method, s.URL+path, rd)
	req.Header.Set("X-API-Key", s.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := s.client.Do(req)
	if err != nil {
		s.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, b
}

type created struct {
	SandboxID       string `json:"sandboxID"`
	TemplateID      string `json:"templateID"`
	EnvdVersion     string `json:"envdVersion"`
	EnvdAccessToken string `json:"envdAccessToken"`
	ClientID        string `json:"clientID"`
}

func (s *server) create(body map[string]any) created {
	s.t.Helper()
	var c created
	st, h, raw := s.raw("POST", "/v2/sandboxes", body)
	s.lastHeader = h
	if st == http.StatusCreated {
		if err := json.Unmarshal(raw, &c); err != nil {
			s.t.Fatalf("create: decode %q: %v", raw, err)
		}
	}
	if st != http.StatusCreated {
		s.t.Fatalf("create: status %d: %s; logs:\n%s", st, raw, s.logs)
	}
	s.seen[c.SandboxID] = true
	return c
}

// headerTransport adds the envd routing/auth headers the SDK sends.
type headerTransport struct {
	id, token string
	base      http.RoundTripper // nil: http.DefaultTransport
}

func (h headerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", h.id)
	r.Header.Set("E2b-Sandbox-Port", "49983")
	if h.token != "" {
		r.Header.Set("X-Access-Token", h.token)
	}
	if h.base != nil {
		return h.base.RoundTrip(r)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func (s *server) envdClient(c created) *http.Client {
	return &http.Client{Transport: headerTransport{id: c.SandboxID, token: c.EnvdAccessToken, base: s.client.Transport}}
}

// run executes bash -l -c cmd in the sandbox through the proxy and returns
// stdout, stderr and the exit code.
func (s *server) run(c created, cmdline string) (string, string, int32, error) {
	s.t.Helper()
	return s.runWith(s.envdClient(c), []string{"-l", "-c", cmdline})
}

// runWith runs /bin/bash with args through hc (which carries the sandbox's
// routing and auth headers) and returns stdout, stderr and the exit code.
func (s *server) runWith(hc *http.Client, args []string) (string, string, int32, error) {
	s.t.Helper()
	pc := processconnect.NewProcessClient(hc, s.URL, connect.WithProtoJSON())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	stdin := false
	stream, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{
		Process: &process.ProcessConfig{Cmd: "/bin/bash", Args: args},
		Stdin:   &stdin,
	}))
	if err != nil {
		return "", "", 0, err
	}
	defer stream.Close()
	var stdout, stderr bytes.Buffer
	var code int32 = -1
	for stream.Receive() {
		ev := stream.Msg().GetEvent()
		if d := ev.GetData(); d != nil {
			stdout.Write(d.GetStdout())
			stderr.Write(d.GetStderr())
		}
		if e := ev.GetEnd(); e != nil {
			code = e.GetExitCode()
		}
	}
	return stdout.String(), stderr.String(), code, stream.Err()
}

func (s *server) mustRun(c created, cmdline string) string {
	s.t.Helper()
	out, errOut, code, err := s.run(c, cmdline)
	if err != nil || code != 0 {
		s.t.Fatalf("run %q: code %d err %v stderr %q; server logs:\n%s", cmdline, code, err, errOut, s.logs)
	}
	return out
}

func errShape(t *testing.T, s *server, method, path string, body any, want int) {
	t.Helper()
	var e struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	if st := s.do(method, path, body, &e); st != want || e.Code != want || e.Message == "" {
		t.Fatalf("%s %s: want %d with {code,message}, got status %d body %+v", method, path, want, st, e)
	}
}

// hostState snapshots what a server leaves on the host, for leak checks.
type hostState struct {
	mounts, netns, links, sandboxDirs, cgroups int
}

// builderEndpoint starts the ID of the network endpoint serve makes for its
// template builder (cmd/cubicle builderNetID).
const builderEndpoint = "cubicle.builder"

func (s *server) snapshot(t *testing.T) hostState {
	var h hostState
	if f, err := os.Open("/proc/self/mountinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			line := sc.Text()
			// runsc keeps one null-netns bind mount per state root; it is the
			// runtime's, not a sandbox's.
			if strings.Contains(line, filepath.Join(s.DataDir, "run")+"/") {
				continue
			}
			// The server's own lxcfs mount lives as long as the server (the
			// leak check after it stops still requires it gone).
			if strings.Contains(line, filepath.Join(s.DataDir, "lxcfs")+"/") {
				continue
			}
			// The reflink disk store is the server's own and stays mounted
			// after it stops, as the data dir's filesystem would; a kept
			// snapshot's layer that is a clone of a disk is the snapshot's.
			if f := strings.Fields(line); len(f) > 4 && (f[4] == filepath.Join(s.DataDir, "disk-store") || testcluster.SnapshotLayerMount(s.DataDir, f[4])) {
				continue
			}
			// The template builder's endpoint is the server's own, not a
			// sandbox's (serve makes it at start, cmd/cubicle builderNetID).
			if strings.Contains(line, "/netns/"+builderEndpoint+".") {
				continue
			}
			if strings.Contains(line, s.DataDir) || strings.Contains(line, "/run/cubicle/"+s.Bridge) {
				h.mounts++
			}
		}
		f.Close()
	}
	builder := false
	ents, _ := os.ReadDir(filepath.Join("/run/cubicle", s.Bridge, "netns"))
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), builderEndpoint+".") {
			builder = true
			continue
		}
		if e.Type().IsRegular() {
			h.netns++
		}
	}
	addrs, _ := os.ReadDir(filepath.Join("/run/cubicle", s.Bridge, "netns", ".addr"))
	for _, a := range addrs {
		if !strings.HasPrefix(a.Name(), builderEndpoint+".") {
			h.netns++
		}
	}
	h.sandboxDirs = len(sandboxEntries(s.DataDir))
	if out, err := exec.Command("ip", "-o", "link", "show", "master", s.Bridge).Output(); err == nil {
		h.links = len(strings.Split(strings.TrimSpace(string(out)), "\n"))
		if strings.TrimSpace(string(out)) == "" {
			h.links = 0
		} else if builder {
			h.links-- // the builder's veth
		}
	}
	for _, ctrl := range []string{"cpu", "memory", "pids", "freezer"} {
		ents, _ := os.ReadDir(filepath.Join("/sys/fs/cgroup", ctrl, s.Cgroup))
		for _, e := range ents {
			if e.IsDir() {
				h.cgroups++
			}
		}
	}
	return h
}

// unmountUnder lazily unmounts every mount point at or under dir, deepest
// first.
func unmountUnder(dir string) { testcluster.UnmountUnder(dir) }

// requireMetrics fails unless every want appears in the server's /metrics
// (on its own listener, --metrics-listen).
func (s *server) requireMetrics(t *testing.T, wants ...string) {
	t.Helper()
	resp, err := http.Get(s.MetricsURL + "/metrics")
	if err != nil {
		t.Fatalf("GET /metrics: %v", err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range wants {
		if !strings.Contains(string(body), want) {
			t.Fatalf("metrics lack %s", want)
		}
	}
}

// freeListenAddr picks a free loopback port below the kernel's ephemeral
// range (testcluster.FreeListenAddr).
func freeListenAddr(t testing.TB) string {
	t.Helper()
	addr, err := testcluster.FreeListenAddr()
	if err != nil {
		t.Fatal(err)
	}
	return addr
}

// sandboxEntries lists what is left of sandboxes in the data dir: their
// own dirs and their root-only state dirs (under sandboxes/.private).
func sandboxEntries(data string) []string {
	var out []string
	for _, dir := range []string{filepath.Join(data, "sandboxes"), filepath.Join(data, "sandboxes", ".private"), filepath.Join(data, "disk-store", "disks")} {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if e.Name() != ".private" {
				out = append(out, filepath.Join(filepath.Base(dir), e.Name()))
			}
		}
	}
	return out
}

// startTLSServer starts a server with --tls-self-signed for domain and
// points its client at the API's name over TLS, trusting the local CA, so
// nodes can join it and tests call it as an SDK would. roots holds the
// local CA.
func startTLSServer(t *testing.T, domain string, extra ...string) (s *server, roots *x509.CertPool) {
	t.Helper()
	s = newServer(t, nil, append([]string{"--domain", domain, "--tls-self-signed"}, extra...)...)
	_, caPath, err := servecert.SelfSigned(filepath.Join(s.DataDir, "tls"), domain)
	if err != nil {
		t.Fatal(err)
	}
	pemCA, err := os.ReadFile(caPath)
	if err != nil {
		t.Fatal(err)
	}
	roots = x509.NewCertPool()
	roots.AppendCertsFromPEM(pemCA)
	s.client = &http.Client{Timeout: time.Minute, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots},
		DialContext: func(ctx context.Context, network, _ string) (net.Conn, error) {
			return (&net.Dialer{Timeout: 5 * time.Second}).DialContext(ctx, network, s.listenOn)
		},
	}}
	s.URL = "https://api." + domain
	s.start()
	return s, roots
}
