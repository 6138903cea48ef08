package integration

import (
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/testenv"
)

// A RUN step is any team's code. It runs as an unprivileged host uid, in
// the builder's own netns with the default sandbox egress: it reaches
// none of the host's API, a listener on the host's bridge address, the
// instance metadata address, a running sandbox's agent, or the local
// registry; it sees none of the host's interfaces; and pip still installs
// from PyPI (through the machine's TLS-intercepting proxy, whose CA is in
// the host bundle passed with --ca-certificates).
func TestTemplateBuildBoundary(t *testing.T) {
	requireBuildkit(t)
	s := startServer(t, "--ca-certificates", "/etc/ssl/certs/ca-certificates.crt")
	sb := s.create(map[string]any{"templateID": "base"})
	sbIP := strings.TrimSpace(s.mustRun(sb, "ip -4 -o addr show dev eth0 | awk '{print $4}' | cut -d/ -f1"))
	gw := strings.TrimSpace(s.mustRun(sb, "ip route | awk '/default/ {print $3}'"))
	if net.ParseIP(sbIP) == nil || net.ParseIP(gw) == nil {
		t.Fatalf("sandbox address %q, gateway %q", sbIP, gw)
	}

	// Targets, each with a positive control from the host's netns.
	hostLn, err := net.Listen("tcp", net.JoinHostPort(gw, "0"))
	if err != nil {
		t.Fatal(err)
	}
	hostSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("host-bridge-address")) })}
	go hostSrv.Serve(hostLn)
	t.Cleanup(func() { hostSrv.Close() })
	meta := metadataListener(t)
	apiURL := s.URL + "/health"
	targets := map[string]string{
		"api":      apiURL,
		"hostaddr": "http://" + hostLn.Addr().String() + "/",
		"metadata": "http://169.254.169.254:" + strconv.Itoa(meta) + "/",
		"agent":    "http://" + net.JoinHostPort(sbIP, "49983") + "/health",
	}
	for name, u := range targets {
		resp, err := (&http.Client{Timeout: 5 * time.Second}).Get(u)
		if err != nil {
			t.Fatalf("positive control %s (%s) from the host: %v", name, u, err)
		}
		resp.Body.Close()
	}

	var probe strings.Builder
	probe.WriteString("import urllib.request\n")
	for name, u := range targets {
		fmt.Fprintf(&probe, "try:\n    urllib.request.urlopen(%q, timeout=5); print('REACHED-%s')\nexcept Exception as e:\n    print('blocked-%s', type(e).__name__)\n", u, name, name)
	}
	steps := []any{
		map[string]any{"type": "RUN", "args": []string{"echo uidmap: $(cat /proc/self/uid_map)"}},
		map[string]any{"type": "RUN", "args": []string{"echo " + base64.StdEncoding.EncodeToString([]byte(probe.String())) + " | base64 -d | python3"}},
		map[string]any{"type": "RUN", "args": []string{"echo links: $(ip -o link | cut -d: -f2 | tr -d ' '); ls /sys/class/net 2>&1 | sed 's/^/sys: /'"}},
		map[string]any{"type": "RUN", "args": []string{"pip install --no-cache-dir --disable-pip-version-check --target /opt/pipcheck six && ls /opt/pipcheck | grep -q '^six.py$' && echo pip-installed"}},
	}
	began := time.Now()
	_, st, logs := s.buildTemplate(t, "boundary", map[string]any{"fromTemplate": "base", "steps": steps, "force": true})
	all := strings.Join(logs, "\n")
	if st.Status != "ready" {
		t.Fatalf("build: %+v\n%s\nserver:\n%s", st, all, s.logs)
	}
	t.Logf("build with pip install: %v", time.Since(began))
	for _, l := range logs {
		if strings.HasPrefix(l, "uidmap: ") || strings.HasPrefix(l, "blocked-") || strings.HasPrefix(l, "REACHED-") ||
			strings.HasPrefix(l, "links: ") || strings.HasPrefix(l, "sys: ") || l == "pip-installed" {
			t.Log(l)
		}
	}

	for name := range targets {
		if strings.Contains(all, "REACHED-"+name) || !strings.Contains(all, "blocked-"+name) {
			t.Errorf("RUN step and %s (%s): not blocked\n%s", name, targets[name], all)
		}
	}
	if !strings.Contains(all, "pip-installed") {
		t.Errorf("pip install in a RUN step failed:\n%s", all)
	}
	var uidmap string
	for _, l := range logs {
		if strings.HasPrefix(l, "uidmap: ") {
			uidmap = l
		}
	}
	if f := strings.Fields(uidmap); len(f) != 4 || f[1] != "0" || f[2] == "0" {
		t.Errorf("RUN step's uid 0 must be an unprivileged host uid; uid_map %q", uidmap)
	}
	var links string
	for _, l := range logs {
		if strings.HasPrefix(l, "links: ") {
			links = l
		}
	}
	if links == "" {
		t.Fatalf("no link list:\n%s", all)
	}
	hostIfs, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, f := range strings.Fields(strings.TrimPrefix(links, "links: ")) {
		name, _, _ := strings.Cut(f, "@") // "eth0@if887"
		seen[name] = true
	}
	for _, ifc := range hostIfs {
		// The builder's own netns has lo and eth0 (its veth end).
		if ifc.Name != "lo" && ifc.Name != "eth0" && seen[ifc.Name] {
			t.Errorf("RUN step sees the host's interface %s: %s", ifc.Name, links)
		}
	}
	if len(seen) != 2 || !seen["lo"] || !seen["eth0"] {
		t.Errorf("RUN step's interfaces %v, want lo and the builder's eth0", seen)
	}
	if strings.Contains(all, "sys: ") && !strings.Contains(all, "No such file") {
		t.Errorf("RUN step lists /sys/class/net:\n%s", all)
	}

	// buildkitd itself: an unprivileged host uid.
	pid := buildkitdPid(t, s.DataDir)
	uids := testenv.ProcUids(t, pid)
	for _, u := range uids {
		if u == "0" {
			t.Errorf("buildkitd (pid %d) host uids %v", pid, uids)
		}
	}
}

// metadataListener serves HTTP on 169.254.169.254 inside a netns this test
// makes, routed from the host over a veth pair, and returns its port.
func metadataListener(t *testing.T) int {
	t.Helper()
	sfx := fmt.Sprintf("%d", os.Getpid()%100000)
	ns, hv, pv := "cubicle-it-meta-"+sfx, "cbmh"+sfx, "cbmp"+sfx
	sh := func(args ...string) {
		t.Helper()
		if out, err := exec.Command(args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v: %s", args, err, out)
		}
	}
	sh("ip", "netns", "add", ns)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", ns).Run() })
	sh("ip", "link", "add", hv, "type", "veth", "peer", "name", pv)
	t.Cleanup(func() { exec.Command("ip", "link", "del", hv).Run() })
	sh("ip", "link", "set", pv, "netns", ns)
	sh("ip", "addr", "add", "169.254.169.1/32", "dev", hv)
	sh("ip", "link", "set", hv, "up")
	sh("ip", "route", "add", "169.254.169.254/32", "dev", hv)
	sh("ip", "-n", ns, "link", "set", "lo", "up")
	sh("ip", "-n", ns, "addr", "add", "169.254.169.254/32", "dev", pv)
	sh("ip", "-n", ns, "link", "set", pv, "up")
	sh("ip", "-n", ns, "route", "add", "169.254.169.1/32", "dev", pv)
	sh("ip", "-n", ns, "route", "add", "default", "via", "169.254.169.1", "dev", pv)
	var ln net.Listener
	if err := network.RunInNetns("/run/netns/"+ns, func() (err error) {
		ln, err = net.Listen("tcp", "169.254.169.254:0")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.Write([]byte("metadata")) })}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ln.Addr().(*net.TCPAddr).Port
}

// buildkitdPid finds the server's buildkitd by its --root under dataDir.
func buildkitdPid(t *testing.T, dataDir string) int {
	t.Helper()
	want := "--root\x00" + filepath.Join(dataDir, "buildkit") + "\x00"
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if b, err := os.ReadFile("/proc/" + e.Name() + "/cmdline"); err == nil && strings.Contains(string(b), want) {
			return pid
		}
	}
	t.Fatalf("no buildkitd with root %s/buildkit", dataDir)
	return 0
}
