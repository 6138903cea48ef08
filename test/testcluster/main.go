// Command cubicle-testcluster starts a throwaway Cubicle cluster on this
// machine for the SDK suites (test/e2b-js, test/e2b-py with CUBICLE_CLUSTER=1):
// a PostgreSQL in a temp dir (internal/store/postgres/pgtest), a pure control
// plane (`cubicle serve --store postgres://… --embedded-node=false
// --tls-self-signed`, plain HTTP on --listen for the SDKs, TLS on
// --listen-tls for the nodes) and N joined `cubicle node run` on loopback,
// each with its own data dir, bridge, pool, nft table and cgroup parent.
//
// Once every node has registered it prints one JSON line on stdout (the
// control plane's URL, an API key, the nodes) and waits. It tears everything
// down, by PID and by name, when its stdin closes (the harness exited or
// closed it) or on SIGTERM/SIGINT, then exits 1 naming whatever the
// sandboxes or the clean-up left on the host. The harness kills the
// sandboxes through the API before that, as it does with a single serve.
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store/postgres/pgtest"
	"github.com/jackc/pgx/v5"
)

type config struct {
	bin, agent, images, runtime, domain, logDir, caCerts string
	nodes                                                int
	cpuOvercommit                                        float64
	lxcfs                                                bool
	ready                                                time.Duration
}

// Ready is the line printed once the cluster serves.
type Ready struct {
	URL    string      `json:"url"`
	APIKey string      `json:"apiKey"`
	Domain string      `json:"domain"`
	Store  string      `json:"store"`
	Logs   []string    `json:"logs"`
	Nodes  []NodeReady `json:"nodes"`
}

// NodeReady describes one node agent.
type NodeReady struct {
	ID      string `json:"id"`
	DataDir string `json:"dataDir"`
	Bridge  string `json:"bridge"`
}

func main() {
	var c config
	flag.StringVar(&c.bin, "cubicle", "", "the cubicle binary (default: next to this one)")
	flag.StringVar(&c.agent, "agent-bin", "", "the cubicle-agent binary (default: next to this one)")
	flag.StringVar(&c.images, "images-dir", "/var/lib/cubicle/images", "image directory holding base/rootfs")
	flag.StringVar(&c.runtime, "runtime", "runc", "the nodes' OCI runtime: runc or runsc")
	flag.StringVar(&c.domain, "domain", "cubicle.local", "the control plane's --domain")
	flag.StringVar(&c.logDir, "log-dir", "", "where the control plane's and nodes' logs go (default: a temp dir, removed at exit)")
	flag.StringVar(&c.caCerts, "ca-certificates", "", "passed to every node as --ca-certificates when set")
	flag.IntVar(&c.nodes, "nodes", 2, "how many node agents (1-8)")
	flag.Float64Var(&c.cpuOvercommit, "cpu-overcommit", 16, "the control plane's --cpu-overcommit: the suites create more 2-CPU sandboxes at once than this machine has CPUs")
	flag.BoolVar(&c.lxcfs, "lxcfs", false, "run lxcfs on each node")
	flag.DurationVar(&c.ready, "ready-timeout", 90*time.Second, "how long the cluster may take to serve")
	flag.Parse()
	if flag.NArg() > 0 {
		fatalf("unexpected arguments %q", flag.Args())
	}
	if c.nodes < 1 || c.nodes > 8 {
		fatalf("--nodes %d: want 1-8", c.nodes)
	}
	if c.runtime != "runc" && c.runtime != "runsc" {
		fatalf("--runtime %q: want runc or runsc", c.runtime)
	}
	self, err := os.Executable()
	if err != nil {
		fatalf("%v", err)
	}
	if c.bin == "" {
		c.bin = filepath.Join(filepath.Dir(self), "cubicle")
	}
	if c.agent == "" {
		c.agent = filepath.Join(filepath.Dir(self), "cubicle-agent")
	}
	for _, f := range []string{c.bin, c.agent, filepath.Join(c.images, "base", "rootfs")} {
		if _, err := os.Stat(f); err != nil {
			fatalf("%v", err)
		}
	}

	// When the harness dies its end of our stdout/stderr goes; a write
	// there must not kill us before the clean-up that its death starts.
	signal.Ignore(syscall.SIGPIPE)
	cl := &cluster{cfg: c}
	// Stop on a signal or on stdin's end, whichever comes first.
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		io.Copy(io.Discard, os.Stdin)
		stop <- syscall.SIGHUP
	}()
	began := time.Now()
	ready, err := cl.start(stop)
	if err == nil {
		line, _ := json.Marshal(ready)
		fmt.Println(string(line))
		fmt.Fprintf(os.Stderr, "cubicle-testcluster: ready in %v\n", time.Since(began).Round(time.Millisecond))
		<-stop
	}
	stopping := time.Now()
	leaks := cl.stop()
	fmt.Fprintf(os.Stderr, "cubicle-testcluster: stopped in %v\n", time.Since(stopping).Round(time.Millisecond))
	if err != nil {
		fmt.Fprintf(os.Stderr, "cubicle-testcluster: %v\n", err)
	}
	if len(leaks) > 0 {
		fmt.Fprintf(os.Stderr, "cubicle-testcluster: left host state behind:\n  %s\n", strings.Join(leaks, "\n  "))
	}
	if err != nil || len(leaks) > 0 {
		os.Exit(1)
	}
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "cubicle-testcluster: "+format+"\n", args...)
	os.Exit(2)
}

type proc struct {
	name   string
	cmd    *exec.Cmd
	exited chan struct{}
	log    string
}

type node struct {
	id, dir, bridge, cgroup string
	proc                    *proc
}

type cluster struct {
	cfg     config
	pg      *pgtest.Server
	dsn     string
	cpDir   string
	logDir  string
	ownLogs bool
	cp      *proc
	nodes   []*node
	apiKey  string
	procs   []*proc
}

func (cl *cluster) cubicle(args ...string) (string, error) {
	cmd := exec.Command(cl.cfg.bin, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("cubicle %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// spawn starts a long-running child, its output in its own log. Pdeathsig
// ends it if this process dies without its clean-up.
func (cl *cluster) spawn(name string, args ...string) (*proc, error) {
	log := filepath.Join(cl.logDir, name+".log")
	f, err := os.Create(log)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	cmd := exec.Command(cl.cfg.bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &proc{name: name, cmd: cmd, exited: make(chan struct{}), log: log}
	go func() { cmd.Wait(); close(p.exited) }()
	cl.procs = append(cl.procs, p)
	return p, nil
}

func (p *proc) dead() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// term sends SIGTERM, then SIGKILL after grace.
func (p *proc) term(grace time.Duration) {
	if p.dead() {
		return
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.exited:
	case <-time.After(grace):
		p.cmd.Process.Kill()
		<-p.exited
	}
}

func suffix() string {
	b := make([]byte, 3)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// freeAddr picks a free loopback port below the kernel's ephemeral range, so
// no outgoing connection takes it before the child binds it.
func freeAddr(taken map[string]bool) (string, error) {
	low := 32768
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		if f := strings.Fields(string(b)); len(f) == 2 {
			if n, err := strconv.Atoi(f[0]); err == nil {
				low = n
			}
		}
	}
	from := max(1024, low-12000)
	for range 200 {
		b := make([]byte, 2)
		rand.Read(b)
		addr := fmt.Sprintf("127.0.0.1:%d", from+(int(b[0])<<8|int(b[1]))%(low-from))
		if taken[addr] {
			continue
		}
		if ln, err := net.Listen("tcp", addr); err == nil {
			ln.Close()
			taken[addr] = true
			return addr, nil
		}
	}
	return "", fmt.Errorf("no free loopback port in %d-%d", from, low-1)
}

// freePools picks n 10.215.X.0/24 pools no interface on the host uses.
func freePools(n int) ([]string, error) {
	out, _ := exec.Command("ip", "-o", "-4", "addr", "show").Output()
	var pools []string
	start := int(suffixByte())
	for i := 0; i < 256 && len(pools) < n; i++ {
		x := (start + i) % 256
		if !strings.Contains(string(out), fmt.Sprintf(" 10.215.%d.", x)) {
			pools = append(pools, fmt.Sprintf("10.215.%d.0/24", x))
		}
	}
	if len(pools) < n {
		return nil, errors.New("no free 10.215.X.0/24 pool")
	}
	return pools, nil
}

func suffixByte() byte {
	b := make([]byte, 1)
	rand.Read(b)
	return b[0]
}

var tokenLine = regexp.MustCompile(`(?m)^token: (\S+)$`)
var pinLine = regexp.MustCompile(`(?m)^ca-pin: (\S+)$`)

func (cl *cluster) start(stop <-chan os.Signal) (*Ready, error) {
	c := cl.cfg
	var err error
	if c.logDir == "" {
		if cl.logDir, err = os.MkdirTemp("", "cubicle-testcluster-logs-"); err != nil {
			return nil, err
		}
		cl.ownLogs = true
	} else {
		cl.logDir = c.logDir
		if err := os.MkdirAll(cl.logDir, 0o755); err != nil {
			return nil, err
		}
	}
	if cl.pg, err = pgtest.Start(); err != nil {
		return nil, err
	}
	if cl.dsn, err = cl.pg.NewDatabase(context.Background()); err != nil {
		return nil, err
	}
	if cl.cpDir, err = os.MkdirTemp("/var/tmp", "cubicle-testcluster-cp-"); err != nil {
		return nil, err
	}
	out, err := cl.cubicle("apikey", "create", "--store", cl.dsn, "--data-dir", cl.cpDir, "--name", "sdk-cluster")
	if err != nil {
		return nil, err
	}
	cl.apiKey = strings.TrimSpace(out)
	if !regexp.MustCompile(`^e2b_[0-9a-f]+$`).MatchString(cl.apiKey) {
		return nil, fmt.Errorf("cubicle apikey create printed %q, want e2b_<hex>", cl.apiKey)
	}

	taken := map[string]bool{}
	listen, err := freeAddr(taken)
	if err != nil {
		return nil, err
	}
	listenTLS, err := freeAddr(taken)
	if err != nil {
		return nil, err
	}
	metrics, err := freeAddr(taken)
	if err != nil {
		return nil, err
	}
	cl.cp, err = cl.spawn("control-plane", "serve", "--store", cl.dsn, "--data-dir", cl.cpDir, "--embedded-node=false",
		"--tls-self-signed", "--domain", c.domain, "--listen", listen, "--listen-tls", listenTLS, "--metrics-listen", metrics,
		"--images-dir", c.images, "--cpu-overcommit", strconv.FormatFloat(c.cpuOvercommit, 'f', -1, 64))
	if err != nil {
		return nil, err
	}
	url := "http://" + listen
	if err := waitUntil(stop, 60*time.Second, cl.cp, "the control plane's /health", func() bool {
		r, err := (&http.Client{Timeout: time.Second}).Get(url + "/health")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == 200 || r.StatusCode == 204
	}); err != nil {
		return nil, err
	}

	pools, err := freePools(c.nodes)
	if err != nil {
		return nil, err
	}
	for i := range c.nodes {
		sfx := suffix()
		n := &node{id: fmt.Sprintf("node-%d", i+1), bridge: "cbk" + sfx, cgroup: "cubicle-tc-" + sfx}
		if n.dir, err = os.MkdirTemp("/var/tmp", "cubicle-testcluster-node-"); err != nil {
			return nil, err
		}
		cl.nodes = append(cl.nodes, n)
		out, err := cl.cubicle("node", "token", "create", "--store", cl.dsn, "--data-dir", cl.cpDir)
		if err != nil {
			return nil, err
		}
		tok, pin := tokenLine.FindStringSubmatch(out), pinLine.FindStringSubmatch(out)
		if tok == nil || pin == nil {
			return nil, fmt.Errorf("node token create printed no token or ca-pin:\n%s", out)
		}
		if _, err := cl.cubicle("node", "join", "--control-plane", "https://"+listenTLS, "--token", tok[1], "--ca-pin", pin[1],
			"--node-id", n.id, "--data-dir", n.dir, "--address", "127.0.0.1"); err != nil {
			return nil, err
		}
		grpcAddr, err := freeAddr(taken)
		if err != nil {
			return nil, err
		}
		dataAddr, err := freeAddr(taken)
		if err != nil {
			return nil, err
		}
		args := []string{"node", "run", "--data-dir", n.dir, "--listen", grpcAddr, "--data-listen", dataAddr,
			"--images-dir", c.images, "--runtime", c.runtime, "--bridge", n.bridge, "--pool", pools[i],
			"--cgroup-parent", n.cgroup, "--agent-bin", c.agent, "--lxcfs=" + strconv.FormatBool(c.lxcfs)}
		if c.caCerts != "" {
			args = append(args, "--ca-certificates", c.caCerts)
		}
		if n.proc, err = cl.spawn(n.id, args...); err != nil {
			return nil, err
		}
	}
	// Every node registered and heartbeating: the scheduler offers it.
	for _, n := range cl.nodes {
		if err := waitUntil(stop, c.ready, n.proc, n.id+" registered", func() bool {
			out, err := exec.Command(c.bin, "node", "list", "--store", cl.dsn, "--json").Output()
			if err != nil {
				return false
			}
			var rows []map[string]any
			if json.Unmarshal(out, &rows) != nil {
				return false
			}
			for _, r := range rows {
				if r["id"] == n.id && r["address"] != nil && r["address"] != "" {
					return true
				}
			}
			return false
		}); err != nil {
			return nil, err
		}
	}
	r := &Ready{URL: url, APIKey: cl.apiKey, Domain: c.domain, Store: cl.dsn, Logs: []string{cl.cp.log}}
	for _, n := range cl.nodes {
		r.Nodes = append(r.Nodes, NodeReady{ID: n.id, DataDir: n.dir, Bridge: n.bridge})
		r.Logs = append(r.Logs, n.proc.log)
	}
	return r, nil
}

// waitUntil polls ok every 200 ms until it holds, p dies, stop fires or
// timeout passes.
func waitUntil(stop <-chan os.Signal, timeout time.Duration, p *proc, what string, ok func() bool) error {
	deadline := time.Now().Add(timeout)
	for {
		if ok() {
			return nil
		}
		if p.dead() {
			return fmt.Errorf("%s exited while waiting for %s:\n%s", p.name, what, p.tail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %v waiting for %s:\n%s", timeout, what, p.tail())
		}
		select {
		case s := <-stop:
			return fmt.Errorf("stopped (%v) while waiting for %s", s, what)
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// stop ends every process, lists what the sandboxes left on each node,
// removes everything and lists what survived that.
func (cl *cluster) stop() []string {
	var leaks []string
	if cl.dsn != "" {
		cl.reportPlacement()
	}
	// All at once: nodes leave sandboxes running for re-adoption on
	// SIGTERM, and the harness killed them through the API already.
	var wg sync.WaitGroup
	for _, p := range cl.procs {
		wg.Go(func() { p.term(20 * time.Second) })
	}
	wg.Wait()
	for _, n := range cl.nodes {
		if n.proc != nil {
			leaks = append(leaks, n.sandboxLeftovers(cl.cfg.runtime)...)
		}
		leaks = append(leaks, n.clean()...)
	}
	if cl.cpDir != "" {
		unmountUnder(cl.cpDir)
		os.RemoveAll(cl.cpDir)
	}
	if cl.pg != nil {
		cl.pg.Stop()
	}
	if cl.ownLogs {
		os.RemoveAll(cl.logDir)
	}
	return leaks
}

// reportPlacement prints how many sandboxes each node ran (killed rows
// stay in the store), so a run shows that every node was used.
func (cl *cluster) reportPlacement() {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, cl.dsn)
	if err != nil {
		fmt.Fprintf(os.Stderr, "cubicle-testcluster: placement report: %v\n", err)
		return
	}
	defer conn.Close(ctx)
	rows, err := conn.Query(ctx, "SELECT node, count(*) FROM sandboxes GROUP BY node ORDER BY node")
	if err != nil {
		fmt.Fprintf(os.Stderr, "cubicle-testcluster: placement report: %v\n", err)
		return
	}
	counts := map[string]int64{}
	for rows.Next() {
		var node string
		var n int64
		if err := rows.Scan(&node, &n); err != nil {
			fmt.Fprintf(os.Stderr, "cubicle-testcluster: placement report: %v\n", err)
			return
		}
		counts[node] = n
	}
	var parts []string
	for _, n := range cl.nodes {
		parts = append(parts, fmt.Sprintf("%s=%d", n.id, counts[n.id]))
		delete(counts, n.id)
	}
	for id, n := range counts {
		parts = append(parts, fmt.Sprintf("%q=%d", id, n))
	}
	fmt.Fprintf(os.Stderr, "cubicle-testcluster: sandboxes per node: %s\n", strings.Join(parts, " "))
}

func (n *node) stateRoot(runtime string) string { return filepath.Join(n.dir, "run", runtime) }

func containers(runtime, root string) ([]string, error) {
	if _, err := os.Stat(root); err != nil {
		return nil, nil
	}
	out, err := exec.Command(runtime, "--root", root, "list", "--quiet").Output()
	if err != nil {
		return nil, fmt.Errorf("%s --root %s list: %v", runtime, root, err)
	}
	return strings.Fields(string(out)), nil
}

// sandboxLeftovers: containers, netns files, links on the bridge,
// sandbox cgroups, sandbox dirs and mounts a node's sandboxes left.
func (n *node) sandboxLeftovers(runtime string) []string {
	var left []string
	ids, err := containers(runtime, n.stateRoot(runtime))
	if err != nil {
		left = append(left, err.Error())
	}
	if len(ids) > 0 {
		left = append(left, fmt.Sprintf("%s: containers %s", n.id, strings.Join(ids, " ")))
	}
	nsDir := filepath.Join("/run/cubicle", n.bridge, "netns")
	ents, _ := os.ReadDir(nsDir)
	for _, e := range ents {
		if e.Type().IsRegular() {
			left = append(left, fmt.Sprintf("%s: netns file %s", n.id, filepath.Join(nsDir, e.Name())))
		}
	}
	if out, _ := exec.Command("ip", "-o", "link", "show", "master", n.bridge).Output(); len(strings.TrimSpace(string(out))) > 0 {
		left = append(left, fmt.Sprintf("%s: links on bridge %s: %s", n.id, n.bridge, strings.TrimSpace(string(out))))
	}
	for _, h := range cgroupHierarchies() {
		ents, _ := os.ReadDir(filepath.Join(h, n.cgroup))
		for _, e := range ents {
			if e.IsDir() {
				left = append(left, fmt.Sprintf("%s: cgroup %s", n.id, filepath.Join(h, n.cgroup, e.Name())))
			}
		}
	}
	for _, d := range []string{filepath.Join(n.dir, "sandboxes"), filepath.Join(n.dir, "sandboxes", ".private")} {
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if e.Name() != ".private" {
				left = append(left, fmt.Sprintf("%s: sandbox dir %s", n.id, filepath.Join(d, e.Name())))
			}
		}
	}
	// runsc keeps one null-netns bind mount per state root; it is the runtime's.
	runRoot := filepath.Join(n.dir, "run") + "/"
	for _, mp := range append(mountsUnder(filepath.Join("/run/cubicle", n.bridge)), mountsUnder(n.dir)...) {
		if !strings.HasPrefix(mp, runRoot) {
			left = append(left, fmt.Sprintf("%s: mount %s", n.id, mp))
		}
	}
	return left
}

// clean removes everything the node made, by name, and lists what
// survived.
func (n *node) clean() []string {
	if n.dir == "" {
		return nil
	}
	var left []string
	for _, rt := range []string{"runc", "runsc"} {
		root := n.stateRoot(rt)
		ids, _ := containers(rt, root)
		for _, id := range ids {
			exec.Command(rt, "--root", root, "kill", id, "KILL").Run()
			exec.Command(rt, "--root", root, "delete", "--force", id).Run()
		}
		if still, _ := containers(rt, root); len(still) > 0 {
			left = append(left, fmt.Sprintf("%s: containers survived delete --force: %s", n.id, strings.Join(still, " ")))
		}
	}
	// Sandbox veths hang off the bridge; deleting the bridge's ports first.
	if out, err := exec.Command("ip", "-o", "link", "show", "master", n.bridge).Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) > 1 {
				exec.Command("ip", "link", "del", strings.SplitN(strings.TrimSuffix(f[1], ":"), "@", 2)[0]).Run()
			}
		}
	}
	exec.Command("ip", "link", "del", n.bridge).Run()
	for _, fam := range []string{"inet", "bridge", "ip", "ip6"} {
		exec.Command("nft", "delete", "table", fam, "cubicle_"+n.bridge).Run()
	}
	for _, h := range cgroupHierarchies() {
		ents, _ := os.ReadDir(filepath.Join(h, n.cgroup))
		for _, e := range ents {
			if e.IsDir() {
				syscall.Rmdir(filepath.Join(h, n.cgroup, e.Name()))
			}
		}
		syscall.Rmdir(filepath.Join(h, n.cgroup))
		syscall.Rmdir(filepath.Join(h, n.cgroup+"-lxcfs"))
	}
	runDir := filepath.Join("/run/cubicle", n.bridge)
	unmountUnder(runDir)
	unmountUnder(n.dir)
	os.RemoveAll(runDir)
	os.RemoveAll(n.dir)

	if exec.Command("ip", "link", "show", n.bridge).Run() == nil {
		left = append(left, n.id+": bridge "+n.bridge)
	}
	if out, err := exec.Command("nft", "list", "tables").Output(); err == nil {
		for _, l := range strings.Split(string(out), "\n") {
			if f := strings.Fields(l); len(f) == 3 && strings.HasSuffix(f[2], "_"+n.bridge) {
				left = append(left, n.id+": nft "+strings.TrimSpace(l))
			}
		}
	}
	for _, h := range cgroupHierarchies() {
		for _, d := range []string{filepath.Join(h, n.cgroup), filepath.Join(h, n.cgroup+"-lxcfs")} {
			if _, err := os.Stat(d); err == nil {
				left = append(left, n.id+": cgroup "+d)
			}
		}
	}
	for _, d := range []string{runDir, n.dir} {
		if _, err := os.Stat(d); err == nil {
			left = append(left, n.id+": dir "+d)
		}
	}
	return left
}

func cgroupHierarchies() []string {
	if _, err := os.Stat("/sys/fs/cgroup/cgroup.controllers"); err == nil {
		return []string{"/sys/fs/cgroup"}
	}
	ents, _ := os.ReadDir("/sys/fs/cgroup")
	var out []string
	for _, e := range ents {
		if e.IsDir() {
			out = append(out, filepath.Join("/sys/fs/cgroup", e.Name()))
		}
	}
	return out
}

var octal = regexp.MustCompile(`\\([0-7]{3})`)

// mountsUnder lists mount points at or under dir, deepest first.
func mountsUnder(dir string) []string {
	raw, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	var points []string
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := octal.ReplaceAllStringFunc(f[4], func(s string) string {
			n, _ := strconv.ParseUint(s[1:], 8, 8)
			return string(rune(n))
		})
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			points = append(points, mp)
		}
	}
	for i, j := 0, len(points)-1; i < j; i, j = i+1, j-1 {
		points[i], points[j] = points[j], points[i]
	}
	return points
}

func unmountUnder(dir string) {
	for _, mp := range mountsUnder(dir) {
		syscall.Unmount(mp, syscall.MNT_DETACH)
	}
}
