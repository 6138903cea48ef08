// Package buildkit supervises a private buildkitd and builds template
// Dockerfiles with it, pushing the result into Cubicle's local registry
// (internal/image).
//
// buildkitd is built from the module pinned in go.mod (pure Go, CGO not
// needed):
//
//	CGO_ENABLED=0 go build -o bin/buildkitd github.com/moby/buildkit/cmd/buildkitd
//
// Every RUN step is a tenant's code, so buildkitd is never host root and
// never on the host's network (docs/templates.md, "The builder's boundary"):
//
//   - It runs as root of its own user namespace, which maps 0..65535 to an
//     unprivileged host range (Config.UserNSBase, below the sandboxes'
//     ranges), with its own mount namespace. The kernel lets serve, which is
//     root, write that mapping itself, so neither rootlesskit nor the setuid
//     newuidmap is needed. In a user namespace BuildKit runs its OCI worker
//     rootless: runc without cgroups and without /sys in RUN steps.
//   - It lives in Config.NetNS, a network namespace serve makes for it as
//     for a sandbox (internal/network, the default egress policy: internet
//     yes; the host, the sandbox pool, internal ranges and metadata no).
//     RUN steps use that namespace (--oci-worker-net=host means "the
//     daemon's", and the daemon's is not the host's).
//   - The local registry listens on the host's loopback, which that
//     namespace cannot reach: for each registry on a loopback address the
//     daemon opens a relay at the same address inside Config.NetNS that
//     forwards to the host's, and serves only connections whose socket is
//     held by buildkitd itself, so a RUN step cannot reach it at all.
//
// The command line (verified as root on Debian 12, runc 1.1.5, kernel 6.18):
//
//	buildkitd --config <root>/buildkitd.toml --root <root> \
//	  --addr unix://<socket> --otel-socket-path <root>/otel-grpc.sock \
//	  --oci-worker=true --oci-worker-binary=/usr/sbin/runc \
//	  --oci-worker-snapshotter=overlayfs --oci-worker-net=host \
//	  --oci-worker-rootless=true --containerd-worker=false --cdi-disabled
//
// with buildkitd.toml holding one block per insecure registry:
//
//	[registry."127.0.0.1:PORT"]
//	  http = true
//	  insecure = true
//
// Notes from getting it to run:
//   - Without --otel-socket-path buildkitd creates /run/buildkit/otel-grpc.sock
//     even when --root and --addr point elsewhere; the flag keeps every file
//     under <root>.
//   - Without --config it reads /etc/buildkit/buildkitd.toml; without
//     --cdi-disabled it watches /etc/cdi and /var/run/cdi (warnings only).
//   - --oci-worker-net=host: the default ("auto") wants CNI plugins; the
//     daemon's own namespace already carries the sandbox egress policy.
//   - The process sandbox (own PID namespace per RUN) works in the user
//     namespace, so --oci-worker-no-process-sandbox is not used.
//   - Root (state dir) is owned by the mapped root; a state dir left by a
//     buildkitd that ran as host root is dropped (it is only a cache).
//   - The dockerfile frontend is built in ("dockerfile.v0"), so no frontend
//     image is pulled and no registry other than ours is contacted.
package buildkit

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	bkclient "github.com/moby/buildkit/client"
	"golang.org/x/sys/unix"
)

var (
	// ErrNotRunning: the daemon is closed or has not come up.
	ErrNotRunning = errors.New("buildkit: daemon not running")
	// ErrStartTimeout: buildkitd did not accept connections in time.
	ErrStartTimeout = errors.New("buildkit: daemon did not become ready")
)

// Config says how to run buildkitd.
type Config struct {
	Binary string // path to buildkitd; default "buildkitd" on PATH
	Root   string // state dir; everything buildkitd writes stays under it
	Socket string // unix socket path; default <Root>/buildkitd.sock
	// InsecureRegistries are host:port names reached over plain HTTP (the
	// local image registry).
	InsecureRegistries []string
	// RegistryAuth are the credentials each build presents to a registry
	// (by host:port), through its session.
	RegistryAuth map[string]Credentials
	// Upstream, when set, opens the connection a registry relay forwards
	// to for registry (one of InsecureRegistries): on a cluster's builder
	// node, TLS to the control plane's registry with the node's
	// certificate. Nil: plain TCP to the same address in the host's
	// network namespace (serve's own loopback registry).
	Upstream func(ctx context.Context, registry string) (net.Conn, error)
	// OCIBinary is the runc binary; default /usr/sbin/runc if present.
	OCIBinary string
	// Snapshotter: "overlayfs" (default) or "native" where overlay mounts are
	// not allowed.
	Snapshotter string
	// NetNS is the network namespace buildkitd and its RUN steps live in: a
	// bind-mounted netns file (a network.Endpoint's NetNSPath). Required:
	// builds never run in the host's network namespace.
	NetNS string
	// UserNSBase is the first host uid and gid of the builder's user
	// namespace (0..UserNSSize-1 inside); default DefaultUserNSBase.
	UserNSBase uint32
	// ReadyTimeout bounds each wait for the socket; default 30s.
	ReadyTimeout time.Duration
	Logger       *slog.Logger
}

const (
	// DefaultUserNSBase puts the builder's 65536 ids just below the
	// sandboxes' ranges (internal/runtime/oci: 1<<30 and up), so no
	// sandbox shares a host uid with it.
	DefaultUserNSBase = 1<<30 - UserNSSize
	// UserNSSize is how many uids and gids the builder's namespace maps.
	UserNSSize = 1 << 16
)

// ErrNoNetNS: Config.NetNS is empty or not a network namespace.
var ErrNoNetNS = errors.New("buildkit: Config.NetNS must name the builder's network namespace")

// Daemon is a supervised buildkitd child process.
type Daemon struct {
	cfg    Config
	args   []string
	log    *slog.Logger
	addr   string
	stopCh chan struct{}
	done   chan struct{}

	mu      sync.Mutex
	proc    *os.Process // current child; nil between restarts
	exited  chan struct{}
	closed  bool
	starts  int
	readyCh chan struct{} // closed when the current child answers
	relays  *relays
}

const (
	backoffMin = 500 * time.Millisecond
	backoffMax = 30 * time.Second
	stopGrace  = 10 * time.Second
)

// Start launches buildkitd and waits until a client can talk to it. The child
// is restarted (with backoff) if it dies, until Close.
func Start(ctx context.Context, cfg Config) (*Daemon, error) {
	if cfg.Root == "" {
		return nil, errors.New("buildkit: Config.Root is required")
	}
	root, err := filepath.Abs(cfg.Root)
	if err != nil {
		return nil, err
	}
	cfg.Root = root
	if err := checkNetNS(cfg.NetNS); err != nil {
		return nil, err
	}
	if cfg.UserNSBase == 0 {
		cfg.UserNSBase = DefaultUserNSBase
	}
	if cfg.Binary == "" {
		cfg.Binary = "buildkitd"
	}
	if cfg.Socket == "" {
		cfg.Socket = filepath.Join(root, "buildkitd.sock")
	}
	if cfg.OCIBinary == "" {
		cfg.OCIBinary = "runc"
		if _, err := os.Stat("/usr/sbin/runc"); err == nil {
			cfg.OCIBinary = "/usr/sbin/runc"
		}
	}
	if cfg.Snapshotter == "" {
		cfg.Snapshotter = "overlayfs"
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = 30 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	bin, err := exec.LookPath(cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("buildkit: %w", err)
	}
	cfg.Binary = bin
	if err := prepareRoot(root, int(cfg.UserNSBase)); err != nil {
		return nil, err
	}
	tmp := filepath.Join(root, "tmp")
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chown(tmp, int(cfg.UserNSBase), int(cfg.UserNSBase)); err != nil {
		return nil, err
	}
	conf := filepath.Join(root, "buildkitd.toml")
	if err := os.WriteFile(conf, []byte(renderConfig(cfg.InsecureRegistries)), 0o600); err != nil {
		return nil, err
	}
	if err := os.Chown(conf, int(cfg.UserNSBase), int(cfg.UserNSBase)); err != nil {
		return nil, err
	}
	d := &Daemon{
		cfg:    cfg,
		log:    cfg.Logger.With("component", "buildkitd"),
		addr:   "unix://" + cfg.Socket,
		stopCh: make(chan struct{}),
		done:   make(chan struct{}),
		args: []string{
			"--config", conf,
			"--root", root,
			"--addr", "unix://" + cfg.Socket,
			"--otel-socket-path", filepath.Join(root, "otel-grpc.sock"),
			"--oci-worker=true",
			"--oci-worker-binary=" + cfg.OCIBinary,
			"--oci-worker-snapshotter=" + cfg.Snapshotter,
			"--oci-worker-net=host",
			"--oci-worker-rootless=true",
			"--containerd-worker=false",
			"--cdi-disabled",
		},
		readyCh: make(chan struct{}),
	}
	if d.relays, err = startRelays(cfg.NetNS, cfg.InsecureRegistries, d.PID, cfg.Upstream); err != nil {
		return nil, err
	}
	started := make(chan error, 1)
	go d.supervise(started)
	if err := <-started; err != nil {
		<-d.done
		d.relays.close()
		return nil, err
	}
	wctx, cancel := context.WithTimeout(ctx, cfg.ReadyTimeout)
	defer cancel()
	if err := d.waitReady(wctx); err != nil {
		d.Close()
		return nil, err
	}
	return d, nil
}

func renderConfig(regs []string) string {
	var b strings.Builder
	b.WriteString("# Written by cubicle; regenerated on every start.\n")
	for _, r := range regs {
		fmt.Fprintf(&b, "[registry.%q]\n  http = true\n  insecure = true\n", r)
	}
	return b.String()
}

// Address is the buildkit client address (unix://...).
func (d *Daemon) Address() string { return d.addr }

// Args is the command line buildkitd runs with (without the binary).
func (d *Daemon) Args() []string { return append([]string(nil), d.args...) }

// PID is the current child's pid, or 0 between restarts.
func (d *Daemon) PID() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.proc == nil {
		return 0
	}
	return d.proc.Pid
}

// Starts counts how many times buildkitd was launched (1 + restarts).
func (d *Daemon) Starts() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.starts
}

// supervise runs on one locked OS thread for its whole life: Pdeathsig is
// delivered when the *thread* that forked the child exits, so the thread must
// outlive every child it starts.
//
// The same thread is switched into Config.NetNS first, so every child it
// forks is born there; the thread is never unlocked and dies with this
// goroutine instead of returning to the pool in the wrong namespace.
func (d *Daemon) supervise(started chan<- error) {
	runtime.LockOSThread()
	defer close(d.done)
	if err := enterNetNS(d.cfg.NetNS); err != nil {
		started <- err
		return
	}
	backoff := backoffMin
	first := true
	for {
		t0 := time.Now()
		cmd, err := d.spawn()
		if first {
			started <- err
			first = false
			if err != nil {
				return
			}
		}
		if err == nil {
			waitErr := cmd.Wait()
			d.mu.Lock()
			d.proc = nil
			close(d.exited)
			d.readyCh = make(chan struct{})
			closed := d.closed
			d.mu.Unlock()
			if closed {
				return
			}
			d.log.Warn("buildkitd exited; restarting", "err", waitErr, "after", backoff)
			if time.Since(t0) > 2*backoffMax {
				backoff = backoffMin // it ran fine for a while: not a crash loop
			}
		} else {
			d.log.Error("buildkitd failed to start", "err", err)
		}
		select {
		case <-d.stopCh:
			return
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, backoffMax)
		go d.markReadyWhenUp()
	}
}

func (d *Daemon) spawn() (*exec.Cmd, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrNotRunning
	}
	// A stale socket from a killed child would make the readiness probe race.
	os.Remove(d.cfg.Socket)
	// Executed through a descriptor opened here, as host root: the mapped
	// root may not be able to walk the path to the binary (a 0700 dir).
	bin, err := os.Open(d.cfg.Binary)
	if err != nil {
		return nil, fmt.Errorf("buildkit: %w", err)
	}
	defer bin.Close()
	cmd := exec.Command("/proc/self/fd/3", d.args...)
	cmd.Args[0] = d.cfg.Binary
	cmd.ExtraFiles = []*os.File{bin}
	cmd.SysProcAttr = d.sysProcAttr()
	cmd.Dir = d.cfg.Root
	cmd.Env = d.env()
	// A plain pipe rather than StdoutPipe: Wait must not race the reader,
	// and the reader ends on EOF when the last holder of the write end exits.
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	err = cmd.Start()
	pw.Close()
	if err != nil {
		pr.Close()
		return nil, fmt.Errorf("buildkit: start %s: %w", d.cfg.Binary, err)
	}
	d.proc = cmd.Process
	d.exited = make(chan struct{})
	d.starts++
	go d.pump(pr)
	return cmd, nil
}

// pump forwards buildkitd's own log lines to the logger.
func (d *Daemon) pump(r io.ReadCloser) {
	defer r.Close()
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		d.log.Debug(sc.Text())
	}
}

func (d *Daemon) markReadyWhenUp() {
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.ReadyTimeout)
	defer cancel()
	d.waitReady(ctx)
}

// waitReady polls until the current child answers ListWorkers.
func (d *Daemon) waitReady(ctx context.Context) error {
	for {
		d.mu.Lock()
		ready, closed := d.readyCh, d.closed
		d.mu.Unlock()
		if closed {
			return ErrNotRunning
		}
		select {
		case <-ready:
			return nil
		default:
		}
		if d.ping(ctx) == nil {
			d.mu.Lock()
			if d.readyCh == ready && d.proc != nil {
				select {
				case <-ready:
				default:
					close(ready)
				}
			}
			d.mu.Unlock()
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: %s: %v", ErrStartTimeout, d.addr, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (d *Daemon) ping(ctx context.Context) error {
	if _, err := os.Stat(d.cfg.Socket); err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	c, err := bkclient.New(pctx, d.addr)
	if err != nil {
		return err
	}
	defer c.Close()
	ws, err := c.ListWorkers(pctx)
	if err != nil {
		return err
	}
	if len(ws) == 0 {
		return errors.New("no workers")
	}
	return nil
}

// client returns a connected client, waiting (bounded by ctx) for a restart
// in progress.
func (d *Daemon) client(ctx context.Context) (*bkclient.Client, error) {
	wctx, cancel := context.WithTimeout(ctx, d.cfg.ReadyTimeout)
	defer cancel()
	if err := d.waitReady(wctx); err != nil {
		return nil, err
	}
	return bkclient.New(ctx, d.addr)
}

// Close stops buildkitd (SIGTERM, then SIGKILL after a grace period), waits
// for it, and lazily unmounts anything it left mounted under Root. It signals
// only the pid it started.
func (d *Daemon) Close() error {
	d.mu.Lock()
	if d.closed {
		d.mu.Unlock()
		<-d.done
		return nil
	}
	d.closed = true
	close(d.stopCh)
	proc, exited := d.proc, d.exited
	d.mu.Unlock()
	if proc != nil {
		proc.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(stopGrace):
			d.log.Warn("buildkitd ignored SIGTERM; killing", "pid", proc.Pid)
			proc.Kill()
			<-exited
		}
	}
	<-d.done
	d.relays.close()
	os.Remove(d.cfg.Socket)
	return UnmountUnder(d.cfg.Root)
}

// UnmountUnder lazily unmounts every mount point at or below dir, deepest
// first. buildkitd unmounts its snapshots on a clean exit; this covers a
// SIGKILL mid-build.
func UnmountUnder(dir string) error {
	dir = filepath.Clean(dir)
	mps, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	var first error
	for i := len(mps) - 1; i >= 0; i-- {
		if err := unix.Unmount(mps[i], unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) && first == nil {
			first = fmt.Errorf("buildkit: unmount %s: %w", mps[i], err)
		}
	}
	return first
}

// mountsUnder lists mount points at or below dir in mount order.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for space etc.).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			var v byte
			ok := true
			for j := 1; j <= 3; j++ {
				c := s[i+j]
				if c < '0' || c > '7' {
					ok = false
					break
				}
				v = v*8 + (c - '0')
			}
			if ok {
				b.WriteByte(v)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
