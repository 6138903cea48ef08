package node

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/agentapi"
	"github.com/cubicle-dev/cubicle/internal/cacerts"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/phase"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/volume"
)

// AgentPathInSandbox is where the agent binary is bind-mounted.
const AgentPathInSandbox = agentapi.PathInSandbox

// AgentTokenInSandbox is where the agent's token file is bind-mounted
// (read-only, root-only): the agent reads it before it serves anything.
const AgentTokenInSandbox = "/.cubicle/envd-token"

// LocalConfig configures the in-process node.
type LocalConfig struct {
	ID string
	// MaxConcurrentBoots bounds the creates that boot at once (the runtime's
	// create and the agent's /init); the rest wait their turn in order
	// (lock_wait). Booting is CPU work: 50 at once on 2 cores all finish
	// late, a few at a time finish early (docs/performance.md). Default:
	// the CPUs, at least 2.
	MaxConcurrentBoots int
	Runtime            runtime.Driver
	Network            network.Manager
	AgentBin           string // host path of the static cubicle-agent binary
	SandboxDir         string // where the driver keeps per-sandbox dirs (for console.log)
	// AgentReadyTimeout bounds how long Create waits for /health.
	AgentReadyTimeout time.Duration
	// ResolvConf, when set, is bind-mounted read-only at /etc/resolv.conf.
	ResolvConf string
	// Lxcfs, when set, is the mountpoint of the node's lxcfs; LxcfsFiles
	// (/proc/meminfo...) are bound read-only from it over the procfs of
	// every sandbox but runsc ones (gVisor's /proc is its own), so free and
	// friends show the sandbox's limits (internal/lxcfs).
	Lxcfs      string
	LxcfsFiles []string
	// PIDsLimit, when set, is every sandbox's pids limit; 0 sizes it from
	// the sandbox's memory (PIDsFor).
	PIDsLimit int64

	// VolumeDir keeps the durable per-(volume, holder) references.
	VolumeDir string
	// VolumeBaseDir is volume_plugin_base_dir: every plugin host_path must be inside it.
	VolumeBaseDir string
	// VolumePlugin returns the node half of a driver's plugin.
	VolumePlugin  func(driver string) (volume.Node, error)
	VolumeDrivers []string
	VolumeMetrics VolumeMetrics
	// CACerts, when set, are added to every sandbox's trust store
	// (internal/cacerts): the image's bundle plus them, and the env vars
	// that make Node.js and certifi users read it.
	CACerts *cacerts.Set
	// EgressCA, when set, is the egress proxy's interception CA. Only a
	// sandbox whose policy has rules trusts it: its agent installs it at
	// /init (cacerts.Install), which every boot, claim and resume sends, and
	// the control plane re-sends /init when PUT /network adds rules. Once in,
	// it stays: it lets the node read TLS only for hosts that have rules.
	EgressCA *cacerts.Set
	// Images, when set, resolves CreateRequest.Image (a node that is not
	// on the control plane's host: imagecache); nil = the node boots from
	// CreateRequest.Layers only, as the embedded node does.
	Images ImageSource
	// SnapshotDir keeps snapshots' layers and memory images (root-only);
	// "" = this node takes no snapshots.
	SnapshotDir string
	// Accel owns the node's accelerators (nil = the node has none).
	Accel *accel.Manager
	// TokenDir keeps each sandbox's agent token file (root-only), bound
	// into the sandbox so its agent knows its token before it serves.
	TokenDir string
	// HoldInit, when set, is called in Create once the sandbox's process
	// has started and before the control plane's first /init. Tests hold
	// it to probe an agent nobody has initialised yet.
	HoldInit func(ctx context.Context, id string, addr netip.Addr) error
	Logger   *slog.Logger
}

// Local runs sandboxes on this machine.
type Local struct {
	cfg    LocalConfig
	client *http.Client
	boots  chan struct{} // MaxConcurrentBoots slots

	mu      sync.Mutex
	lastCPU map[string]cpuSample
	vols    *volumes
	// creating marks creates in flight, so the accelerator reconciler does
	// not release devices whose sandbox has no runtime process yet.
	creating map[string]bool
	// Exit watches (watch.go): the watch per running sandbox, operations in
	// flight and their generations (so List does not re-adopt a sandbox an
	// operation just paused or deleted), and the exits reported.
	watches map[string]*exitWatch
	busy    map[string]int
	gens    map[string]uint64
	exits   chan Exit
}

type cpuSample struct {
	t     time.Time
	nanos uint64
}

var _ Node = (*Local)(nil)

// NewLocal validates the config.
func NewLocal(cfg LocalConfig) (*Local, error) {
	if cfg.Runtime == nil || cfg.Network == nil {
		return nil, errors.New("node: runtime and network are required")
	}
	if _, err := os.Stat(cfg.AgentBin); err != nil {
		return nil, fmt.Errorf("node: agent binary: %w", err)
	}
	if cfg.ID == "" {
		cfg.ID = "local"
	}
	if cfg.AgentReadyTimeout == 0 {
		cfg.AgentReadyTimeout = 15 * time.Second
	}
	if cfg.MaxConcurrentBoots <= 0 {
		cfg.MaxConcurrentBoots = max(2, goruntime.NumCPU())
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.VolumePlugin == nil {
		cfg.VolumePlugin = func(d string) (volume.Node, error) { return nil, fmt.Errorf("no volume plugins configured") }
	}
	if cfg.VolumeDir == "" {
		return nil, errors.New("node: VolumeDir is required")
	}
	if cfg.VolumeBaseDir == "" {
		cfg.VolumeBaseDir = volume.DefaultBaseDir
	}
	// Root only: volume data is written by sandboxes, and a set-ID file in
	// it must not be reachable by the host's other users (docs/security.md).
	if err := os.MkdirAll(cfg.VolumeBaseDir, 0o700); err != nil {
		return nil, fmt.Errorf("node: volume base dir: %w", err)
	}
	if err := os.Chmod(cfg.VolumeBaseDir, 0o700); err != nil {
		return nil, fmt.Errorf("node: volume base dir: %w", err)
	}
	if cfg.SnapshotDir != "" {
		// Root only, like the images dir: snapshot layers hold whatever
		// a hostile sandbox wrote, set-ID files included.
		if err := os.MkdirAll(cfg.SnapshotDir, 0o700); err != nil {
			return nil, fmt.Errorf("node: snapshot dir: %w", err)
		}
		if err := os.Chmod(cfg.SnapshotDir, 0o700); err != nil {
			return nil, fmt.Errorf("node: snapshot dir: %w", err)
		}
	}
	if err := os.MkdirAll(cfg.VolumeDir, 0o700); err != nil {
		return nil, fmt.Errorf("node: volume ref dir: %w", err)
	}
	if cfg.TokenDir == "" {
		return nil, errors.New("node: TokenDir is required")
	}
	// Root only: the files are the sandboxes' agent tokens.
	if err := os.MkdirAll(cfg.TokenDir, 0o700); err != nil {
		return nil, fmt.Errorf("node: token dir: %w", err)
	}
	if err := os.Chmod(cfg.TokenDir, 0o700); err != nil {
		return nil, fmt.Errorf("node: token dir: %w", err)
	}
	tr := &http.Transport{
		DialContext:         DialSandbox(&net.Dialer{Timeout: 2 * time.Second}), // a pool per sandbox: see SandboxHost
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     30 * time.Second,
	}
	vols := &volumes{dir: cfg.VolumeDir, baseDir: cfg.VolumeBaseDir, plugins: cfg.VolumePlugin, log: cfg.Logger, metrics: cfg.VolumeMetrics}
	l := &Local{cfg: cfg, client: &http.Client{Transport: tr}, boots: make(chan struct{}, cfg.MaxConcurrentBoots), lastCPU: map[string]cpuSample{}, vols: vols, creating: map[string]bool{},
		watches: map[string]*exitWatch{}, busy: map[string]int{}, gens: map[string]uint64{}, exits: make(chan Exit, 64)}
	l.openSnapshots()
	return l, nil
}

// openSnapshots opens every snapshot on the node at start: after a reboot
// a layer that is a mount is mounted again before anything reads it (a
// template build from a snapshot reads its files outside any create).
// Creates open their snapshots again, so one that fails here fails them
// with its reason rather than stacking an empty layer.
func (l *Local) openSnapshots() {
	sn, err := l.snapshotter()
	if err != nil {
		return
	}
	ids, err := l.Snapshots(context.Background())
	if err != nil {
		l.cfg.Logger.Warn("snapshots: cannot list", "err", err)
		return
	}
	for _, id := range ids {
		if err := sn.OpenSnapshot(context.Background(), filepath.Join(l.cfg.SnapshotDir, id)); err != nil {
			l.cfg.Logger.Warn("snapshot: cannot open its layer", "snapshot", id, "err", err)
		}
	}
}

// Create wires network, starts the runtime and initialises the agent. Any
// failure undoes the steps already taken.
func (l *Local) Create(ctx context.Context, req CreateRequest) (_ Sandbox, err error) {
	phase.From(ctx).SetRuntime(l.cfg.Runtime.Name())
	endWait := phase.Start(ctx, phase.LockWait)
	done := l.begin(req.ID, false)
	endWait()
	defer done()
	// The network is set up beside the runtime's disk and rootfs; the
	// runtime waits for it (spec.NetworkReady) before the sandbox joins
	// its netns.
	var ep network.Endpoint
	var netErr error
	netDone := make(chan struct{})
	go func() {
		defer close(netDone)
		defer phase.Start(ctx, phase.Network)()
		ep, netErr = l.cfg.Network.Setup(ctx, req.ID, req.Policy)
		if netErr != nil {
			netErr = fmt.Errorf("network setup: %w", netErr)
		}
	}()
	networkReady := func(ctx context.Context) error {
		select {
		case <-netDone:
			return netErr
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	defer func() {
		if err != nil {
			<-netDone // Setup ends on its own; what it made is undone below
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
			defer cancel()
			if l.cfg.Runtime.Delete(cctx, req.ID) == nil {
				l.removeToken(req.ID)
			}
			if netErr == nil {
				_ = l.cfg.Network.Teardown(cctx, req.ID)
			}
		}
	}()
	if err := l.writeToken(req.ID, req.EnvdToken); err != nil {
		return Sandbox{}, err
	}
	mounts := l.baseMounts(req.ID)
	mounts = append(mounts, req.Mounts...)
	var devices []runtime.Device
	var att accel.Attachment
	if len(req.Accelerators) > 0 {
		l.mu.Lock()
		l.creating[req.ID] = true
		l.mu.Unlock()
		defer func() {
			l.mu.Lock()
			delete(l.creating, req.ID)
			l.mu.Unlock()
		}()
		defer func() {
			if err != nil {
				// Runs before the network teardown: the container must be
				// gone before its devices are released.
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
				defer cancel()
				if derr := l.cfg.Runtime.Delete(cctx, req.ID); derr == nil {
					if rerr := l.releaseAccelerators(cctx, req.ID); rerr != nil {
						l.cfg.Logger.Error("accelerator rollback", "sandbox", req.ID, "err", rerr)
					}
				}
			}
		}()
		if att, err = l.reserveAccelerators(ctx, req); err != nil {
			return Sandbox{}, err
		}
		var amounts []runtime.Mount
		devices, amounts = accelSpec(att)
		mounts = append(mounts, amounts...)
		if len(att.Env) > 0 {
			env := map[string]string{}
			for k, v := range att.Env {
				env[k] = v
			}
			for k, v := range req.EnvVars {
				env[k] = v
			}
			req.EnvVars = env
		}
	}
	if len(req.Volumes) > 0 {
		defer func() {
			if err != nil {
				// Defers run last-in first-out, so this runs before the
				// network teardown above: the container must be gone
				// before its volumes are detached.
				cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
				defer cancel()
				_ = l.cfg.Runtime.Delete(cctx, req.ID)
				if derr := l.vols.detachHolder(cctx, req.ID); derr != nil {
					l.cfg.Logger.Error("volume rollback", "sandbox", req.ID, "err", derr)
				}
			}
		}()
		for _, va := range req.Volumes {
			hp, aerr := l.vols.attach(ctx, req.ID, HolderSandbox, va)
			if aerr != nil {
				return Sandbox{}, aerr
			}
			mounts = append(mounts, runtime.Mount{Source: hp, Destination: va.Path, ReadOnly: va.ReadOnly})
		}
	}
	spec, err := l.runtimeSpec(ctx, &req, l.cfg.Network.NetNSPath(req.ID), mounts, devices)
	if err != nil {
		return Sandbox{}, err
	}
	spec.NetworkReady = networkReady
	// Only the boot itself takes a slot: an image pull or a volume attach
	// (above) waits on I/O and must not hold one.
	endSlot := phase.Start(ctx, phase.LockWait)
	select {
	case l.boots <- struct{}{}:
		endSlot()
	case <-ctx.Done():
		endSlot()
		return Sandbox{}, ctx.Err()
	}
	defer func() { <-l.boots }()
	// The agent says when it serves over a pipe the runtime hands it,
	// rather than being found by polling /health.
	var ready *os.File
	if rp, ok := l.cfg.Runtime.(runtime.ReadyPiper); ok {
		r, w, perr := os.Pipe()
		if perr != nil {
			return Sandbox{}, perr
		}
		defer r.Close()
		spec.Ready, ready = w, r
		spec.Args = append(spec.Args, "-ready-fd", strconv.Itoa(rp.ReadyFD()))
	}
	info, err := l.cfg.Runtime.Create(ctx, spec)
	if spec.Ready != nil {
		spec.Ready.Close() // the sandbox holds its own copy
	}
	if err != nil {
		select {
		case <-netDone:
			if netErr != nil && errors.Is(err, netErr) {
				return Sandbox{}, netErr // the network's error, not the runtime's
			}
		default:
		}
		return Sandbox{}, fmt.Errorf("runtime create: %w", err)
	}
	if err := networkReady(ctx); err != nil {
		return Sandbox{}, err
	}
	if l.cfg.HoldInit != nil {
		if err := l.cfg.HoldInit(ctx, req.ID, ep.Addr); err != nil {
			return Sandbox{}, err
		}
	}
	if err := l.initAgent(ctx, req.ID, ep.Addr, req, req.CurrentToken, ready); err != nil {
		return Sandbox{}, err
	}
	if len(req.Accelerators) > 0 {
		if err := l.checkGuest(ctx, req.ID, ep.Addr, req.EnvdToken, att, req.AccelContract); err != nil {
			return Sandbox{}, err
		}
		if err := l.cfg.Accel.Attached(req.ID); err != nil {
			return Sandbox{}, err
		}
	}
	l.watch(req.ID, info.Pid)
	return Sandbox{ID: req.ID, Addr: ep.Addr, State: runtime.StateRunning, Pid: info.Pid}, nil
}

// initBody is the /init a sandbox's agent gets for req. Only a sandbox
// whose policy has HTTPS rules gets the egress CA (and the env vars that make
// runtimes read the trust store it joins). The agent runs the start command
// once per boot, so re-sending it on resume is harmless.
func initBody(req CreateRequest, egressCA *cacerts.Set, now time.Time) agentapi.Init {
	ts := now.UTC()
	b := agentapi.Init{AccessToken: &req.EnvdToken, DefaultUser: &req.DefaultUser, EnvVars: req.EnvVars, Timestamp: &ts}
	if req.Policy.InterceptsTLS() && egressCA != nil {
		b.EnvVars = cacerts.Env()
		maps.Copy(b.EnvVars, req.EnvVars)
		b.EgressCA = string(egressCA.PEM())
	}
	if req.StartCmd != "" {
		b.StartCmd, b.StartUser, b.StartWorkdir = req.StartCmd, &req.StartUser, &req.StartWorkdir
	}
	if req.DefaultWorkdir != "" {
		b.DefaultWorkdir = &req.DefaultWorkdir
	}
	return b
}

// PIDsFor is a sandbox's pids limit: fixed when set, else one task per MiB
// of memory within [256, 4096]. Sized so that a fork storm of small
// processes (a few hundred KiB each) meets the pids limit well before the
// memory limit: fork fails with EAGAIN, nothing is OOM-killed, and the
// sandbox stays usable.
func PIDsFor(fixed int64, memoryMB int) int64 {
	if fixed > 0 {
		return fixed
	}
	return min(max(int64(memoryMB), 256), 4096)
}

func agentURL(id string, addr netip.Addr, path string) string {
	return "http://" + SandboxHost(id, netip.AddrPortFrom(addr, AgentPort)) + path
}

// initAgent waits for /health then POSTs /init. currentToken authorises
// re-initialisation of an agent that already has a token (resume).
//
// ready, when not nil, is the read end of the pipe the agent writes a byte
// to once it serves: that byte replaces the polling. Without it (the pipe
// closed first, an agent that did not write) /health is polled.
func (l *Local) initAgent(ctx context.Context, id string, addr netip.Addr, req CreateRequest, currentToken string, ready *os.File) error {
	deadline := time.Now().Add(l.cfg.AgentReadyTimeout)
	delay := 2 * time.Millisecond
	endReady := phase.Start(ctx, phase.AgentReady)
	for signalled := agentSignalled(ctx, ready, deadline); !signalled; {
		hctx, cancel := context.WithTimeout(ctx, time.Second)
		r, _ := http.NewRequestWithContext(hctx, http.MethodGet, agentURL(id, addr, "/health"), nil)
		resp, err := l.client.Do(r)
		cancel()
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode/100 == 2 {
				break
			}
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w after %s (last error: %v)", ErrAgentTimeout, l.cfg.AgentReadyTimeout, err)
		}
		time.Sleep(delay)
		if delay < 50*time.Millisecond {
			delay *= 2
		}
	}
	endReady()
	defer phase.Start(ctx, phase.Init)()
	body, err := json.Marshal(initBody(req, l.cfg.EgressCA, time.Now()))
	if err != nil {
		return fmt.Errorf("agent init: %w", err)
	}
	r, _ := http.NewRequestWithContext(ctx, http.MethodPost, agentURL(id, addr, "/init"), bytes.NewReader(body))
	r.Header.Set("Content-Type", "application/json")
	if currentToken != "" {
		r.Header.Set("X-Access-Token", currentToken)
	}
	resp, err := l.client.Do(r)
	if err != nil {
		return fmt.Errorf("agent init: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("agent init: status %d: %s", resp.StatusCode, b)
	}
	// The file follows the agent's token, so an agent that boots again
	// from it (a stopped sandbox resumed) starts with the current one.
	return l.writeToken(id, req.EnvdToken)
}

// agentSignalled waits until deadline (or ctx) for the agent's byte on
// ready; false when there is no pipe or it closed or timed out without one.
func agentSignalled(ctx context.Context, ready *os.File, deadline time.Time) bool {
	if ready == nil {
		return false
	}
	if ready.SetReadDeadline(deadline) != nil {
		return false // not pollable: poll /health instead
	}
	stop := context.AfterFunc(ctx, func() { ready.SetReadDeadline(time.Now()) })
	defer stop()
	var b [1]byte
	n, _ := ready.Read(b[:])
	return n == 1
}

func (l *Local) tokenPath(id string) string { return filepath.Join(l.cfg.TokenDir, id) }

// writeToken writes in place: the file is bind-mounted, and a rename would
// leave the sandbox's bind on the old inode.
func (l *Local) writeToken(id, tok string) error {
	if tok == "" {
		return errors.New("node: sandbox has no agent token")
	}
	if err := os.WriteFile(l.tokenPath(id), []byte(tok), 0o600); err != nil {
		return fmt.Errorf("node: agent token: %w", err)
	}
	return nil
}

func (l *Local) removeToken(id string) {
	if err := os.Remove(l.tokenPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		l.cfg.Logger.Warn("remove agent token", "sandbox", id, "err", err)
	}
}

// Delete tears down runtime then network; both are idempotent.
func (l *Local) Delete(ctx context.Context, id string) error {
	done := l.begin(id, true)
	defer func() { done(); l.forget(id) }()
	l.mu.Lock()
	delete(l.lastCPU, id)
	l.mu.Unlock()
	rerr := l.cfg.Runtime.Delete(ctx, id)
	nerr := l.cfg.Network.Teardown(ctx, id)
	var verr error
	var aerr error
	if rerr == nil {
		// Only once no process can use the mounts or devices any more.
		verr = l.vols.detachHolder(ctx, id)
		aerr = l.releaseAccelerators(ctx, id)
		l.removeToken(id)
	}
	return errors.Join(rerr, nerr, verr, aerr)
}

// AttachVolume implements Node.
func (l *Local) AttachVolume(ctx context.Context, holder string, v VolumeAttachment) (string, error) {
	return l.vols.attach(ctx, holder, HolderContent, v)
}

// DetachVolume implements Node.
func (l *Local) DetachVolume(ctx context.Context, holder, volumeID string) error {
	return l.vols.detach(ctx, holder, volumeID)
}

// ContentDir is the host directory of a volume the node holds attached for
// the volume-content API (AttachVolume), read from the node's own durable
// reference; ErrVolumeNotAttached when there is none. The data plane serves
// a volume's files from here only, never from a path a caller names.
func (l *Local) ContentDir(_ context.Context, volumeID string) (string, error) {
	return l.vols.contentDir(volumeID)
}

// VolumeRefs implements Node.
func (l *Local) VolumeRefs(ctx context.Context) ([]VolumeRef, error) { return l.vols.list() }

func (l *Local) notFound(err error) error {
	if errors.Is(err, runtime.ErrNotFound) || errors.Is(err, network.ErrNotFound) {
		return errors.Join(ErrNotFound, err)
	}
	return err
}

// Pause freezes (runc) or checkpoints (runsc) the sandbox.
func (l *Local) Pause(ctx context.Context, id string) error {
	// Not watched while paused: a runsc checkpoint ends the sandbox process.
	defer l.begin(id, true)()
	err := l.cfg.Runtime.Pause(ctx, id)
	if err != nil {
		l.watchAfter(ctx, id) // still running, most likely
	}
	return l.notFound(err)
}

// Resume undoes Pause and re-initialises the agent.
func (l *Local) Resume(ctx context.Context, id string, req CreateRequest) error {
	defer l.begin(id, true)()
	if err := l.cfg.Runtime.Resume(ctx, id); err != nil {
		return l.notFound(err)
	}
	ep, err := l.cfg.Network.Get(ctx, id)
	if err != nil {
		return l.notFound(err)
	}
	if err := l.initAgent(ctx, id, ep.Addr, req, req.EnvdToken, nil); err != nil {
		return err
	}
	l.watchAfter(ctx, id)
	return nil
}

// Reinit implements Node: the agent is already up, so this is one /init.
func (l *Local) Reinit(ctx context.Context, id string, req CreateRequest, currentToken string) error {
	ep, err := l.cfg.Network.Get(ctx, id)
	if err != nil {
		return l.notFound(err)
	}
	return l.initAgent(ctx, id, ep.Addr, req, currentToken, nil)
}

// Get reports runtime state and address.
func (l *Local) Get(ctx context.Context, id string) (Sandbox, error) {
	info, err := l.cfg.Runtime.Inspect(ctx, id)
	if err != nil {
		return Sandbox{}, l.notFound(err)
	}
	ep, err := l.cfg.Network.Get(ctx, id)
	if err != nil {
		return Sandbox{}, l.notFound(err)
	}
	return Sandbox{ID: id, Addr: ep.Addr, State: info.State, Pid: info.Pid}, nil
}

// Address is the address of sandbox id on the node's bridge, read from
// the network's endpoints alone: the data plane looks it up once per
// tunnel, and Get's runtime query (`runc state`, a process: about 5 ms
// here) would be most of a tunnel's cost. The endpoint exists from Create
// to Delete, so an unknown ID is ErrNotFound as with Get; the sandbox's
// state is not read (a dial to one that is not running fails on its own).
func (l *Local) Address(ctx context.Context, id string) (netip.Addr, error) {
	ep, err := l.cfg.Network.Get(ctx, id)
	if err != nil {
		return netip.Addr{}, l.notFound(err)
	}
	return ep.Addr, nil
}

// List joins runtime and network views; a sandbox missing either half is
// still listed (with what is known) so recovery can clean it up.
func (l *Local) List(ctx context.Context) ([]Sandbox, error) {
	gens := l.snapshotGens()
	infos, err := l.cfg.Runtime.List(ctx)
	if err != nil {
		return nil, err
	}
	// Re-adopts running sandboxes after a restart (and any whose watch was lost).
	l.adopt(infos, gens)
	eps, err := l.cfg.Network.List(ctx)
	if err != nil {
		return nil, err
	}
	byID := map[string]*Sandbox{}
	var out []Sandbox
	for _, in := range infos {
		byID[in.ID] = &Sandbox{ID: in.ID, State: in.State, Pid: in.Pid}
	}
	for _, ep := range eps {
		if s, ok := byID[ep.ID]; ok {
			s.Addr = ep.Addr
		} else {
			byID[ep.ID] = &Sandbox{ID: ep.ID, Addr: ep.Addr, State: runtime.StateStopped}
		}
	}
	// Volume refs of a sandbox that never got (or lost) its runtime half,
	// e.g. a crash during Attach, so recovery's Delete detaches them.
	holders, err := l.vols.sandboxHolders()
	if err != nil {
		return nil, err
	}
	for id := range holders {
		if _, ok := byID[id]; !ok {
			byID[id] = &Sandbox{ID: id, State: runtime.StateStopped}
		}
	}
	for _, s := range byID {
		out = append(out, *s)
	}
	return out, nil
}

// Stats combines cgroup readings with the agent's disk numbers.
func (l *Local) Stats(ctx context.Context, id, token string) (Stats, error) {
	rs, err := l.cfg.Runtime.Stats(ctx, id)
	if err != nil {
		return Stats{}, l.notFound(err)
	}
	now := time.Now()
	st := Stats{Time: now, MemUsed: rs.MemoryBytes, MemTotal: rs.MemoryLimit, MemCache: rs.MemoryCache}
	l.mu.Lock()
	prev, ok := l.lastCPU[id]
	l.lastCPU[id] = cpuSample{t: now, nanos: rs.CPUUsageNanos}
	l.mu.Unlock()
	if ok && now.After(prev.t) && rs.CPUUsageNanos >= prev.nanos {
		st.CPUUsedPct = float64(rs.CPUUsageNanos-prev.nanos) / float64(now.Sub(prev.t).Nanoseconds()) * 100
	}
	// Disk numbers come from inside the sandbox; a paused sandbox cannot answer,
	// so they are best effort.
	mctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if m, err := l.AgentMetrics(mctx, id, token); err == nil {
		st.DiskUsed, st.DiskTotal = uint64(m["disk_used"]), uint64(m["disk_total"])
	}
	return st, nil
}

// AgentMetrics fetches the agent's /metrics (disk usage lives there).
func (l *Local) AgentMetrics(ctx context.Context, id, token string) (map[string]float64, error) {
	ep, err := l.cfg.Network.Get(ctx, id)
	if err != nil {
		return nil, l.notFound(err)
	}
	r, _ := http.NewRequestWithContext(ctx, http.MethodGet, agentURL(id, ep.Addr, "/metrics"), nil)
	r.Header.Set("X-Access-Token", token)
	resp, err := l.client.Do(r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("agent metrics: status %d", resp.StatusCode)
	}
	var m map[string]float64
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&m); err != nil {
		return nil, err
	}
	return m, nil
}

// CheckUpstream implements Node over the node's network manager.
func (l *Local) CheckUpstream(ctx context.Context, address string) error {
	ur, ok := l.cfg.Network.(network.UpstreamResolver)
	if !ok {
		return &network.FieldError{Field: "egressProxy", Kind: network.ErrUpstream, Err: errors.New("this node runs no egress proxy to tunnel through")}
	}
	_, err := ur.ResolveUpstream(ctx, address)
	return err
}

// UpdatePolicy replaces the egress policy.
func (l *Local) UpdatePolicy(ctx context.Context, id string, p network.Policy) error {
	return l.notFound(l.cfg.Network.UpdatePolicy(ctx, id, p))
}

// Logs returns the last 1 MiB of the sandbox console.
func (l *Local) Logs(ctx context.Context, id string) ([]byte, error) {
	path := filepath.Join(l.cfg.SandboxDir, id, "console.log")
	if c, ok := l.cfg.Runtime.(interface{ ConsoleLog(id string) string }); ok {
		path = c.ConsoleLog(id) // the oci driver keeps it in a root-only dir
	}
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, ErrNotFound
		}
		return nil, err
	}
	defer f.Close()
	const max = 1 << 20
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		f.Seek(fi.Size()-max, io.SeekStart)
	}
	return io.ReadAll(io.LimitReader(f, max))
}
