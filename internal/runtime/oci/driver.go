// Package oci implements runtime.Driver by exec'ing an OCI runtime binary
// (runc, crun or gVisor's runsc) against bundles it generates itself.
package oci

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/diskimage"
	"github.com/cubicle-dev/cubicle/internal/diskstore"
	"github.com/cubicle-dev/cubicle/internal/idlock"
	"github.com/cubicle-dev/cubicle/internal/phase"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

// Errors specific to this driver (the runtime.Err* sentinels are used too).
var (
	ErrInvalidSpec = errors.New("oci: invalid sandbox spec")
	ErrCommand     = errors.New("oci: runtime command failed")
	ErrConfig      = errors.New("oci: invalid driver config")
	// ErrHostUnsupported: this runtime cannot work on this host's setup.
	ErrHostUnsupported = errors.New("oci: runtime not supported on this host")
)

// Config configures a Driver.
type Config struct {
	// Runtime is "runc", "runsc" or "crun".
	Runtime string
	// BinaryPath of the runtime; default: Runtime looked up in PATH.
	BinaryPath string
	// StateDir is passed as --root so we only ever see our own containers
	// (e.g. <data>/run/<runtime>).
	StateDir string
	// SandboxDir holds the per-sandbox dirs (e.g. <data>/sandboxes).
	SandboxDir string
	// CgroupParent is the cgroup every sandbox lives under: /<parent>/<id>.
	// Default "cubicle".
	CgroupParent string
	// RunscFlags are extra global flags for runsc, appended after the
	// defaults (--platform=systrap --overlay2=none --oci-seccomp
	// --allow-suid), so they win.
	RunscFlags []string
	// RunscPauseMode: "checkpoint" (default; checkpoint to disk, kill, restore
	// on resume) or "pause" (runsc pause/resume, memory stays resident).
	RunscPauseMode string
	// CommandTimeout bounds every runtime invocation. Default 60s.
	CommandTimeout time.Duration
	// UserNS runs sandboxes in user namespaces of their own (userns.go):
	// under runc/crun the container, under runsc the sentry and gofer.
	UserNS bool
	// Disks makes the sandboxes' disk images (disk.go); nil formats each
	// one in the sandbox's private dir.
	Disks *diskstore.Store
}

// Driver is an OCI runtime driver. Safe for concurrent use.
type Driver struct {
	cfg      Config
	bin      string
	cgroupNS bool

	locks idlock.Map // serialises lifecycle ops per sandbox

	mu      sync.Mutex
	slots   map[string]int      // user namespace slot per sandbox (userns.go)
	upperNS map[uint32]*os.File // user namespace of each range's upper view (userns.go)

	noUpperView bool // tests: take mountUpperView's fallback (a kernel before 5.19)
}

var (
	_ runtime.Driver        = (*Driver)(nil)
	_ runtime.DeviceCapable = (*Driver)(nil)
)

var idRE = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// New validates cfg, resolves the binary and creates StateDir/SandboxDir.
func New(cfg Config) (*Driver, error) {
	switch cfg.Runtime {
	case "runc", "runsc", "crun":
	default:
		return nil, fmt.Errorf("%w: runtime %q", ErrConfig, cfg.Runtime)
	}
	if cfg.StateDir == "" || cfg.SandboxDir == "" {
		return nil, fmt.Errorf("%w: StateDir and SandboxDir are required", ErrConfig)
	}
	if cfg.CgroupParent == "" {
		cfg.CgroupParent = "cubicle"
	}
	cfg.CgroupParent = strings.Trim(cfg.CgroupParent, "/")
	if cfg.RunscPauseMode == "" {
		cfg.RunscPauseMode = "checkpoint"
	}
	if cfg.RunscPauseMode != "checkpoint" && cfg.RunscPauseMode != "pause" {
		return nil, fmt.Errorf("%w: RunscPauseMode %q", ErrConfig, cfg.RunscPauseMode)
	}
	if cfg.CommandTimeout <= 0 {
		cfg.CommandTimeout = 60 * time.Second
	}
	if cfg.Runtime == "crun" && hybridWithV2Controllers() {
		// crun refuses every create with "cgroups in hybrid mode not
		// supported, drop all controllers from cgroupv2" (seen with 1.8.1).
		return nil, fmt.Errorf("%w: crun needs pure cgroup v1/v2, not hybrid with v2 controllers", ErrHostUnsupported)
	}
	bin := cfg.BinaryPath
	if bin == "" {
		bin = cfg.Runtime
	}
	p, err := exec.LookPath(bin)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrConfig, err)
	}
	// No host user but root may enter a sandbox's dir (each is 0700, owned
	// by root or by the sandbox's user namespace root): its filesystem,
	// set-ID binaries included, is not theirs to run. The sandbox dir
	// itself is traversable, so runc in a user namespace can reach its
	// rootfs.
	for _, dm := range []struct {
		dir  string
		mode os.FileMode
	}{{cfg.StateDir, 0o700}, {cfg.SandboxDir, 0o711}} {
		if !filepath.IsAbs(dm.dir) {
			return nil, fmt.Errorf("%w: %q is not absolute", ErrConfig, dm.dir)
		}
		if err := os.MkdirAll(dm.dir, dm.mode); err != nil {
			return nil, err
		}
		if err := os.Chmod(dm.dir, dm.mode); err != nil {
			return nil, err
		}
	}
	if err := rootOnlyDir(filepath.Join(cfg.SandboxDir, privateDir)); err != nil {
		return nil, err
	}
	_, nsErr := os.Stat("/proc/self/ns/cgroup")
	d := &Driver{cfg: cfg, bin: p, cgroupNS: nsErr == nil, slots: map[string]int{}}
	if d.userns() {
		if err := checkTraversable(cfg.SandboxDir); err != nil {
			return nil, err
		}
		// util-linux: runContainer needs them (bindOwnedUserns, specRlimits, annotationNetns).
		for _, tool := range []string{"unshare", "prlimit", "nsenter"} {
			if !d.ownedUserns() {
				break
			}
			if _, err := exec.LookPath(tool); err != nil {
				return nil, fmt.Errorf("%w: user-namespaced sandboxes need util-linux's %s: %v", ErrHostUnsupported, tool, err)
			}
		}
		if err := checkIdmap(cfg.SandboxDir); err != nil {
			return nil, fmt.Errorf("%w: user namespaces need idmapped mounts of the image filesystem: %v", ErrHostUnsupported, err)
		}
		if d.ownedUserns() {
			if err := checkOwnedUserns(cfg.SandboxDir); err != nil {
				return nil, fmt.Errorf("%w: an unprivileged uid cannot create a user namespace here (user.max_user_namespaces, kernel.unprivileged_userns_clone): %v", ErrHostUnsupported, err)
			}
		}
		if err := d.loadSlots(); err != nil {
			return nil, err
		}
	}
	if err := d.migrateState(); err != nil {
		return nil, err
	}
	return d, nil
}

// privateNames are what moved from a sandbox's own dir to privateDir.
var privateNames = []string{"bundle", "mounts.json", "netns.json", "console.log", "checkpoint", diskImage, "stopped"}

// migrateState moves the state of sandboxes made before privateDir
// existed out of their own dirs, so they stop, resume and report logs as
// before. A symlink in their place (something the sandbox's uid planted)
// is left where it is, never followed.
func (d *Driver) migrateState() error {
	ents, err := os.ReadDir(d.cfg.SandboxDir)
	if err != nil {
		return err
	}
	for _, e := range ents {
		if !e.IsDir() || !idRE.MatchString(e.Name()) {
			continue
		}
		id := e.Name()
		if _, err := os.Lstat(d.priv(id)); err == nil {
			continue
		}
		var legacy []string
		for _, n := range privateNames {
			if fi, err := os.Lstat(filepath.Join(d.dir(id), n)); err == nil && fi.Mode()&os.ModeSymlink == 0 {
				legacy = append(legacy, n)
			}
		}
		if len(legacy) == 0 {
			continue
		}
		if err := os.Mkdir(d.priv(id), 0o700); err != nil {
			return err
		}
		for _, n := range legacy {
			if err := os.Rename(filepath.Join(d.dir(id), n), filepath.Join(d.priv(id), n)); err != nil {
				return fmt.Errorf("oci: move %s's %s to %s: %w", id, n, d.priv(id), err)
			}
		}
	}
	return nil
}

// Name implements runtime.Driver.
func (d *Driver) Name() string { return d.cfg.Runtime }

// SupportsDevices implements runtime.DeviceCapable: runc and crun mknod the
// nodes and program the device cgroup; runsc would need gVisor's nvproxy,
// which is not wired up yet.
func (d *Driver) SupportsDevices() bool { return d.cfg.Runtime != "runsc" }

// Config returns the effective configuration (defaults filled in).
func (d *Driver) Config() Config { return d.cfg }

func (d *Driver) lock(id string) func() { return d.locks.Lock(id) }

func (d *Driver) dir(id string) string { return filepath.Join(d.cfg.SandboxDir, id) }

// privateDir, under SandboxDir, holds what host root reads back or acts
// on for each sandbox: its bundle (the OCI spec runc and runsc run as
// root), the mounts to stage again, the saved network config, the console
// log root appends to, the checkpoint, the disk image and the stopped
// marker. It and everything in it are root's (0700). A user-namespaced
// sandbox's own dir belongs to its host uid (so runc, as that uid, can
// reach the rootfs), and the owner of a directory may rename or replace
// any entry in it: state kept there could be swapped by that uid to
// redirect what root later mounts, runs or writes. ".private" can never be
// a sandbox ID (idRE).
const privateDir = ".private"

// priv is the sandbox's root-only state dir (privateDir).
func (d *Driver) priv(id string) string { return filepath.Join(d.cfg.SandboxDir, privateDir, id) }

func (d *Driver) globalArgs() []string {
	a := []string{"--root", d.cfg.StateDir}
	if d.cfg.Runtime == "runsc" {
		// overlay2=none: writes must reach our host overlay upper dir, not a
		// gVisor-internal overlay. oci-seccomp: enforce the spec's profile
		// inside the sentry (ignored otherwise; see RunscSeccomp).
		// allow-suid: gVisor ignores set-ID bits without it, so sudo fails;
		// elevation stays inside the sentry, nosuid mounts and
		// NoNewPrivileges are still honoured (docs/security.md).
		a = append(a, "--platform=systrap", "--overlay2=none", "--oci-seccomp", "--allow-suid")
		a = append(a, d.cfg.RunscFlags...)
	}
	return a
}

// command builds a runtime invocation. Runtimes run in their own process
// group so signals aimed at cubicle's group never reach sandboxes.
func (d *Driver) command(ctx context.Context, args ...string) *exec.Cmd {
	return d.commandVia(ctx, nil, args...)
}

// commandVia is command run through via (a program that execs the rest).
func (d *Driver) commandVia(ctx context.Context, via []string, args ...string) *exec.Cmd {
	argv := append(append(append([]string(nil), via...), d.bin), append(d.globalArgs(), args...)...)
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.WaitDelay = 2 * time.Second
	return cmd
}

// run executes a short runtime command and returns stdout.
func (d *Driver) run(ctx context.Context, args ...string) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.CommandTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := d.command(ctx, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.Bytes(), fmt.Errorf("%w: %s %s: %v: %s", ErrCommand, d.cfg.Runtime,
			strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// runWithConsole runs a command whose children become the sandbox (create,
// restore): they inherit the console log as stdio, so no pipe outlives us.
func (d *Driver) runWithConsole(ctx context.Context, id string, args ...string) error {
	return d.runWithConsoleVia(ctx, id, via{}, args...)
}

// via is how a runtime command is started: through the programs in argv
// (each execs the rest), with files passed on as fds 3, 4...
type via struct {
	argv  []string
	files []*os.File
}

func (d *Driver) runWithConsoleVia(ctx context.Context, id string, v via, args ...string) error {
	ctx, cancel := context.WithTimeout(ctx, d.cfg.CommandTimeout)
	defer cancel()
	logPath := d.ConsoleLog(id)
	f, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o640)
	if err != nil {
		return err
	}
	defer f.Close()
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return err
	}
	defer devnull.Close()
	st, _ := f.Stat()
	cmd := d.commandVia(ctx, v.argv, args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = devnull, f, f
	if len(v.files) > 0 {
		cmd.ExtraFiles = v.files
		// runc counts $LISTEN_FDS into the fds it passes on: a socket-
		// activated server's own must not shift them.
		cmd.Env = slices.DeleteFunc(os.Environ(), func(e string) bool {
			return strings.HasPrefix(e, "LISTEN_FDS=") || strings.HasPrefix(e, "LISTEN_PID=") || strings.HasPrefix(e, "LISTEN_FDNAMES=")
		})
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%w: %s %s: %v: %s", ErrCommand, d.cfg.Runtime,
			strings.Join(args, " "), err, tailFrom(logPath, st.Size()))
	}
	return nil
}

func tailFrom(path string, off int64) string {
	b, err := os.ReadFile(path)
	if err != nil || off > int64(len(b)) {
		return ""
	}
	b = b[off:]
	if len(b) > 2048 {
		b = b[len(b)-2048:]
	}
	return strings.TrimSpace(string(b))
}

// ociState is the subset of `<runtime> state` / `list --format json` we use.
type ociState struct {
	ID      string    `json:"id"`
	Pid     int       `json:"pid"`
	Status  string    `json:"status"`
	Created time.Time `json:"created"`
}

// state returns the runtime's view of id; ok=false when the runtime has no
// container with that id.
func (d *Driver) state(ctx context.Context, id string) (ociState, bool, error) {
	out, err := d.run(ctx, "state", id)
	if err == nil {
		var s ociState
		if jerr := json.Unmarshal(out, &s); jerr != nil {
			return s, false, fmt.Errorf("%w: state %s: %v", ErrCommand, id, jerr)
		}
		d.settle(&s)
		return s, true, nil
	}
	// `state` fails both for unknown ids and for real errors; decide which
	// without parsing the error text. runc keeps <root>/<id>/state.json, so
	// its absence settles it; for other runtimes, list.
	if d.cfg.Runtime == "runc" {
		if _, serr := os.Stat(filepath.Join(d.cfg.StateDir, id, "state.json")); errors.Is(serr, os.ErrNotExist) {
			return ociState{}, false, nil
		}
	}
	all, lerr := d.listRetry(ctx)
	if lerr != nil {
		return ociState{}, false, errors.Join(err, lerr)
	}
	for _, s := range all {
		if s.ID == id {
			return ociState{}, false, err // exists, but state failed
		}
	}
	return ociState{}, false, nil
}

// listRetry tolerates `list` failing while another container is half
// created or deleted (it cannot load that one's state for a moment).
func (d *Driver) listRetry(ctx context.Context) (l []ociState, err error) {
	for i := 0; i < 5; i++ {
		if l, err = d.list(ctx); err == nil {
			return l, nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-time.After(time.Duration(i+1) * 20 * time.Millisecond):
		}
	}
	return nil, err
}

func (d *Driver) list(ctx context.Context) ([]ociState, error) {
	out, err := d.run(ctx, "list", "--format", "json")
	if err != nil {
		return nil, err
	}
	var l []ociState
	if len(bytes.TrimSpace(out)) == 0 {
		return nil, nil
	}
	if err := json.Unmarshal(out, &l); err != nil {
		return nil, fmt.Errorf("%w: list: %v", ErrCommand, err)
	}
	for i := range l {
		d.settle(&l[i])
	}
	return l, nil
}

// settle corrects runsc's view of a sandbox whose process is gone: runsc
// keeps reporting "running" for a second or two after the sandbox process
// exited (its init was killed, or the OOM killer took the sandbox), while
// runc reports "stopped" at once.
func (d *Driver) settle(s *ociState) {
	if d.cfg.Runtime == "runsc" && s.Status == "running" && s.Pid > 0 && !pidAlive(s.Pid) {
		s.Status = "stopped"
	}
}

// pidAlive reports whether pid exists and is not a zombie.
func pidAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')') // "pid (comm) S ...", comm may hold ')'
	if i < 0 || i+2 >= len(b) {
		return false
	}
	return b[i+2] != 'Z' && b[i+2] != 'X'
}

func mapState(status string) runtime.State {
	switch status {
	case "running":
		return runtime.StateRunning
	case "paused":
		return runtime.StatePaused
	default: // created, stopped, creating
		return runtime.StateStopped
	}
}

// Create implements runtime.Driver.
func (d *Driver) Create(ctx context.Context, spec runtime.Spec) (_ runtime.Info, err error) {
	if !idRE.MatchString(spec.ID) {
		return runtime.Info{}, fmt.Errorf("%w: id %q", ErrInvalidSpec, spec.ID)
	}
	if len(spec.Layers) == 0 || len(spec.Args) == 0 {
		return runtime.Info{}, fmt.Errorf("%w: need at least one layer and Args", ErrInvalidSpec)
	}
	for _, m := range spec.Mounts {
		if !filepath.IsAbs(m.Destination) || !filepath.IsAbs(m.Source) {
			return runtime.Info{}, fmt.Errorf("%w: mount %s -> %s must be absolute", ErrInvalidSpec, m.Source, m.Destination)
		}
		if m.Under != "" && !d.userns() {
			// The mount is staged from a checked descriptor only on the
			// user-namespaced path; runc would resolve the path itself.
			return runtime.Info{}, fmt.Errorf("%w: host mounts need user-namespaced sandboxes (--userns on)", runtime.ErrUnsupported)
		}
	}
	if spec.Restore != "" && !d.MemorySnapshots() {
		return runtime.Info{}, fmt.Errorf("%w: %s cannot restore memory snapshots", runtime.ErrUnsupported, d.cfg.Runtime)
	}
	if len(spec.Devices) > 0 && !d.SupportsDevices() {
		return runtime.Info{}, fmt.Errorf("%w: %s cannot pass device nodes through (needs nvproxy)", runtime.ErrUnsupported, d.cfg.Runtime)
	}
	if err := validateDevices(spec.Devices); err != nil {
		return runtime.Info{}, err
	}
	endWait := phase.Start(ctx, phase.LockWait)
	unlock := d.lock(spec.ID)
	endWait()
	defer unlock()

	dir := d.dir(spec.ID)
	if err := os.Mkdir(dir, 0o700); err != nil {
		if errors.Is(err, os.ErrExist) {
			return runtime.Info{}, fmt.Errorf("%w: %s", runtime.ErrAlreadyExists, spec.ID)
		}
		return runtime.Info{}, err
	}
	// A runtime container without our dir is a leftover we must not clobber.
	if exists, serr := d.containerExists(ctx, spec.ID); serr != nil || exists {
		os.Remove(dir)
		if serr != nil {
			return runtime.Info{}, serr
		}
		return runtime.Info{}, fmt.Errorf("%w: %s (runtime state)", runtime.ErrAlreadyExists, spec.ID)
	}
	defer func() {
		if err != nil {
			// Fresh context: cleanup must run even if ctx is what failed.
			cctx, cancel := context.WithTimeout(context.Background(), 2*d.cfg.CommandTimeout)
			defer cancel()
			if derr := d.destroy(cctx, spec.ID); derr != nil {
				err = errors.Join(err, derr)
			}
		}
	}()

	var nsBase uint32
	if d.userns() {
		if nsBase, err = d.allocSlot(spec.ID); err != nil {
			return runtime.Info{}, err
		}
	}
	// A crash may have left the private dir of a sandbox whose own dir
	// was then removed: it is ours to replace.
	if err := os.RemoveAll(d.priv(spec.ID)); err != nil {
		return runtime.Info{}, err
	}
	if err := os.Mkdir(d.priv(spec.ID), 0o700); err != nil {
		return runtime.Info{}, err
	}
	rootfs := filepath.Join(dir, "rootfs")
	bundle := d.bundle(spec.ID)
	for _, p := range []string{rootfs, bundle} {
		if err := os.Mkdir(p, 0o755); err != nil {
			return runtime.Info{}, err
		}
	}
	endDisk := phase.Start(ctx, phase.Disk)
	err = d.setupDisk(ctx, spec.ID, spec.Resources.DiskMB)
	endDisk()
	if err != nil {
		return runtime.Info{}, err
	}
	if err := d.rootfs(ctx, &spec, rootfs, bundle, nsBase); err != nil {
		return runtime.Info{}, err
	}
	if spec.NetworkReady != nil {
		endWait := phase.Start(ctx, phase.NetworkWait)
		err := spec.NetworkReady(ctx)
		endWait()
		if err != nil {
			return runtime.Info{}, err
		}
	}
	if d.cfg.Runtime == "runsc" && spec.NetNSPath != "" {
		if err := saveNetns(spec.NetNSPath, d.netnsFile(spec.ID)); err != nil {
			return runtime.Info{}, err
		}
	}
	if spec.Restore != "" {
		// The sandbox continues from a memory snapshot; its rootfs holds
		// the files the image was taken with.
		var args []string
		if nsBase != 0 {
			// The image was taken in another sandbox, whose uid range
			// differs, and runsc refuses a spec whose mappings differ from
			// the checkpoint's. Each sandbox's files are idmapped to its
			// own range, so the sentry sees the same owners either way.
			// runsc's other checks (mounts, seccomp, capabilities) held
			// under enforce before; a difference there is now logged.
			args = append(args, "--restore-spec-validation=warning")
		}
		args = append(args, "restore", "--image-path", spec.Restore, "--bundle", bundle,
			"--pid-file", filepath.Join(bundle, "pid"), "--detach", spec.ID)
		endRestore := phase.Start(ctx, phase.OCIRun)
		err := d.runWithConsole(ctx, spec.ID, args...)
		endRestore()
		if err != nil {
			return runtime.Info{}, err
		}
		return d.inspectLocked(ctx, spec.ID)
	}
	if spec.Ready != nil {
		// Later boots of this bundle (startStopped) pass a pipe too: PID 1
		// was told to expect one.
		if err := os.WriteFile(d.readyMarker(spec.ID), nil, 0o600); err != nil {
			return runtime.Info{}, err
		}
	}
	endRun := phase.Start(ctx, phase.OCIRun)
	err = d.runContainer(ctx, spec.ID, spec.Ready)
	endRun()
	if err != nil {
		return runtime.Info{}, err
	}
	return d.startedInfo(ctx, spec.ID)
}

// containerExists says whether the runtime holds a container id. runc
// keeps its state in <root>/<id>, so a stat answers without running it
// (a runc process is ~7 ms on the create path); others are asked.
func (d *Driver) containerExists(ctx context.Context, id string) (bool, error) {
	if d.cfg.Runtime == "runc" {
		_, err := os.Lstat(filepath.Join(d.cfg.StateDir, id))
		if errors.Is(err, os.ErrNotExist) {
			return false, nil
		}
		return err == nil, err
	}
	_, exists, err := d.state(ctx, id)
	return exists, err
}

// startedInfo is a just-started sandbox's Info. runc's pid file names its
// init, written before run returns, so it needs no `runc state` (another
// ~7 ms); runsc's pid file names its sandbox process, not what state
// reports, so runsc is asked.
func (d *Driver) startedInfo(ctx context.Context, id string) (runtime.Info, error) {
	if d.cfg.Runtime == "runc" {
		b, err := os.ReadFile(filepath.Join(d.bundle(id), "pid"))
		if err == nil {
			if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 && pidAlive(pid) {
				return runtime.Info{ID: id, State: runtime.StateRunning, Pid: pid, Created: time.Now()}, nil
			}
		}
		// Gone already (its init exited at once): state says how.
	}
	return d.inspectLocked(ctx, id)
}

// rootfs assembles the sandbox's root (upper dirs on its disk, the
// overlay, idmapped for a user namespace) and writes its OCI bundle.
func (d *Driver) rootfs(ctx context.Context, spec *runtime.Spec, rootfs, bundle string, nsBase uint32) (err error) {
	defer phase.Start(ctx, phase.Rootfs)()
	upper, work := d.UpperDir(spec.ID), filepath.Join(d.diskDir(spec.ID), "work")
	for _, p := range []string{upper, work} {
		if err := os.Mkdir(p, 0o755); err != nil {
			return err
		}
	}
	// Stored 0-based: a user-namespaced sandbox writes its upper through
	// an idmapped view (mountUpperView).
	if err := seedFiles(upper, spec.Files, 0); err != nil {
		return err
	}
	if nsBase != 0 {
		if spec.Mounts, err = d.idmappedRootfs(ctx, spec.ID, nsBase, spec.Layers, upper, work, rootfs, spec.Mounts, spec.Devices); err != nil {
			return err
		}
	} else if err := mountOverlay(spec.Layers, upper, work, rootfs); err != nil {
		return err
	}
	if err := prepareRootfs(rootfs, spec.Mounts); err != nil {
		return err
	}
	ociSpec, err := d.buildSpec(*spec, rootfs, nsBase)
	if err != nil {
		return err
	}
	b, err := json.MarshalIndent(ociSpec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(filepath.Join(bundle, "config.json"), b, 0o600)
}

// readyFD is the descriptor PID 1 finds Spec.Ready at.
const readyFD = 3

// ReadyFD implements runtime.ReadyPiper.
func (d *Driver) ReadyFD() int { return readyFD }

// readyMarker records that id's bundle was created with a ready pipe.
func (d *Driver) readyMarker(id string) string { return filepath.Join(d.priv(id), "ready-pipe") }

// readyFiles is what runContainer passes on as fd 3: ready, or for a
// bundle created with one and booted again, a pipe nobody reads (PID 1's
// write fails, which it ignores). done closes the driver's copies.
func (d *Driver) readyFiles(id string, ready *os.File) (files []*os.File, done func(), err error) {
	if ready != nil {
		return []*os.File{ready}, func() {}, nil
	}
	if _, ok := statOK(d.readyMarker(id)); !ok {
		return nil, func() {}, nil
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, nil, err
	}
	r.Close()
	return []*os.File{w}, func() { w.Close() }, nil
}

// runContainer creates and starts id's bundle in one runtime call
// (`run --detach`: one process, where create and start were two). A
// user-namespaced sandbox joins a namespace owned by its own uid
// (bindOwnedUserns), bound at usernsPath only while runc joins it: the
// container's processes keep it alive from then on.
func (d *Driver) runContainer(ctx context.Context, id string, ready *os.File) error {
	bundle := d.bundle(id)
	files, closeFiles, err := d.readyFiles(id, ready)
	if err != nil {
		return err
	}
	defer closeFiles()
	var args []string
	if len(files) > 0 {
		if d.cfg.Runtime == "runsc" {
			args = append(args, "--pass-fd", fmt.Sprintf("%d:%d", readyFD, readyFD))
		} else {
			args = append(args, "--preserve-fds", strconv.Itoa(len(files)))
		}
	}
	var wrap []string // rlimits (specRlimits)
	if d.ownedUserns() {
		d.mu.Lock()
		slot, ok := d.slots[id]
		d.mu.Unlock()
		if !ok {
			return fmt.Errorf("oci: %s has no user namespace slot", id)
		}
		prlimit, err := exec.LookPath("prlimit")
		if err != nil {
			return fmt.Errorf("%w: %v", ErrHostUnsupported, err)
		}
		rl := nofileRlimit(true)
		wrap = []string{prlimit, fmt.Sprintf("--nofile=%d:%d", rl.Soft, rl.Hard), "--"}
		netns, err := specNetns(bundle)
		if err != nil {
			return err
		}
		if netns != "" {
			nsenter, err := exec.LookPath("nsenter")
			if err != nil {
				return fmt.Errorf("%w: %v", ErrHostUnsupported, err)
			}
			wrap = append([]string{nsenter, "--net=" + netns, "--"}, wrap...)
		}
		p := d.usernsPath(id)
		if err := bindOwnedUserns(slotBase(slot), usernsSize, p); err != nil {
			return err
		}
		defer unbindUserns(p)
	}
	args = append(append([]string{"run", "--detach"}, args...), "--bundle", bundle, "--pid-file", filepath.Join(bundle, "pid"), id)
	if err := d.runWithConsoleVia(ctx, id, via{argv: wrap, files: files}, args...); err != nil {
		return err
	}
	return d.bootIDAfterRun(id)
}

// specNetns is the network namespace runc must be started in, from the
// bundle's config (annotationNetns), or "".
func specNetns(bundle string) (string, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return "", err
	}
	var sp struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(b, &sp); err != nil {
		return "", fmt.Errorf("oci: %s: %w", bundle, err)
	}
	return sp.Annotations[annotationNetns], nil
}

// usernsPath is where runContainer binds the sandbox's user namespace.
func (d *Driver) usernsPath(id string) string { return filepath.Join(d.dir(id), "userns") }

// Delete implements runtime.Driver.
func (d *Driver) Delete(ctx context.Context, id string) error {
	if !idRE.MatchString(id) {
		return nil // cannot exist
	}
	unlock := d.lock(id)
	defer unlock()
	return d.destroy(ctx, id)
}

// destroy removes everything for id; it tries every step and reports all
// failures, so a retry can finish the job.
func (d *Driver) destroy(ctx context.Context, id string) error {
	var errs []error
	st, exists, err := d.state(ctx, id)
	if err != nil {
		errs = append(errs, err)
	}
	if exists {
		if err := d.removeContainer(ctx, id, st.Status); err != nil {
			errs = append(errs, err)
		}
	}
	d.abortHostConns(id)
	dir := d.dir(id)
	if _, saved := statOK(d.netnsFile(id)); saved {
		// runsc moved the netns's addresses into its netstack: put them
		// back, so the netns is as it was given (a rollback boots a new
		// container in it). A netns already torn down is no matter.
		if err := d.restoreNetnsFor(id); err != nil && !errors.Is(err, os.ErrNotExist) {
			slog.Debug("oci: restore netns on delete", "sandbox", id, "err", err)
		}
	}
	if err := unmountUnder(dir); err != nil {
		errs = append(errs, err)
	}
	if _, err := os.Lstat(d.snapshotDiskMount(id)); err == nil {
		if err := unmountUnder(d.snapshotDiskMount(id)); err != nil {
			errs = append(errs, err)
		}
	}
	if err := removeCgroups(d.cfg.CgroupParent, id); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		if err := errors.Join(os.RemoveAll(dir), os.RemoveAll(d.priv(id)), d.removeDiskImage(id)); err != nil {
			errs = append(errs, err)
		} else {
			d.freeSlot(id) // only once nothing of the sandbox holds its uids
		}
	}
	return errors.Join(errs...)
}

// removeContainer kills the runtime container id (in status) and deletes
// it, leaving the sandbox's dir and mounts alone.
func (d *Driver) removeContainer(ctx context.Context, id, status string) error {
	// runsc's delete --force SIGKILLs the sandbox and waits for it in
	// ~30ms; its kill+state path only reports "stopped" after ~1.5s.
	// A paused (frozen) runc container cannot die until thawed, so it
	// goes straight to delete --force, which thaws and kills.
	running := status == "running" || status == "created"
	if running && d.cfg.Runtime != "runsc" {
		// Errors ignored: the container may exit between state and kill;
		// delete --force below is the authoritative step.
		_, _ = d.run(ctx, "kill", id, "KILL")
		d.waitStopped(ctx, id, 5*time.Second)
	}
	if _, err := d.run(ctx, "delete", "--force", id); err != nil {
		if _, still, _ := d.state(ctx, id); still {
			return err
		}
	}
	return nil
}

func (d *Driver) waitStopped(ctx context.Context, id string, max time.Duration) {
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		st, exists, err := d.state(ctx, id)
		if err != nil || !exists || st.Status == "stopped" {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (d *Driver) pausedMarker(id string) string {
	return filepath.Join(d.checkpointDir(id), "complete")
}

// pausedOnDisk: a sandbox without a runtime container that Pause
// checkpointed or Stop stopped.
func (d *Driver) pausedOnDisk(id string) bool {
	_, ckpt := statOK(d.pausedMarker(id))
	_, stopped := statOK(d.stoppedMarker(id))
	return ckpt || stopped
}

func (d *Driver) exists(id string) bool {
	_, err := os.Stat(d.dir(id))
	return err == nil
}

// Pause implements runtime.Driver.
func (d *Driver) Pause(ctx context.Context, id string) error {
	unlock := d.lock(id)
	defer unlock()
	info, err := d.inspectLocked(ctx, id)
	if err != nil {
		return err
	}
	if info.State != runtime.StateRunning {
		return fmt.Errorf("%w: %s is %s", runtime.ErrNotRunning, id, info.State)
	}
	if d.cfg.Runtime == "runsc" && d.cfg.RunscPauseMode == "checkpoint" {
		return d.checkpoint(ctx, id)
	}
	_, err = d.run(ctx, "pause", id)
	return err
}

// checkpoint saves the sandbox to <id>/checkpoint; runsc stops the container
// afterwards, and we delete the runtime container (rootfs stays mounted) so
// restore can reuse the id.
func (d *Driver) checkpoint(ctx context.Context, id string) error {
	img := d.checkpointDir(id)
	if err := os.RemoveAll(img); err != nil {
		return err
	}
	if err := os.Mkdir(img, 0o700); err != nil {
		return err
	}
	if err := d.checkpointFits(id, img); err != nil {
		os.RemoveAll(img)
		return err
	}
	if _, err := d.run(ctx, "checkpoint", "--image-path", img, id); err != nil {
		os.RemoveAll(img)
		return err
	}
	// No wait for "stopped": delete --force reaps the exiting sandbox itself.
	if _, err := d.run(ctx, "delete", "--force", id); err != nil {
		return err
	}
	d.abortHostConns(id)
	return os.WriteFile(d.pausedMarker(id), nil, 0o600)
}

// Resume implements runtime.Driver.
func (d *Driver) Resume(ctx context.Context, id string) error {
	unlock := d.lock(id)
	defer unlock()
	info, err := d.inspectLocked(ctx, id)
	if err != nil {
		return err
	}
	if info.State != runtime.StatePaused {
		return fmt.Errorf("%w: %s is %s", runtime.ErrNotPaused, id, info.State)
	}
	if _, stopped := statOK(d.stoppedMarker(id)); stopped {
		return d.startStopped(ctx, id)
	}
	if d.cfg.Runtime == "runsc" && d.cfg.RunscPauseMode == "checkpoint" {
		img := d.checkpointDir(id)
		bundle := d.bundle(id)
		if err := d.restoreNetnsFor(id); err != nil {
			return err
		}
		if err := d.runWithConsole(ctx, id, "restore", "--image-path", img, "--bundle", bundle,
			"--pid-file", filepath.Join(bundle, "pid"), "--detach", id); err != nil {
			// Drop the half-restored container so the sandbox reads as paused
			// again (the checkpoint is kept) and Resume can be retried.
			if _, derr := d.run(ctx, "delete", "--force", id); derr != nil {
				if _, still, _ := d.state(ctx, id); still {
					err = errors.Join(err, derr)
				}
			}
			return err
		}
		return os.RemoveAll(img)
	}
	_, err = d.run(ctx, "resume", id)
	return err
}

// Inspect implements runtime.Driver.
func (d *Driver) Inspect(ctx context.Context, id string) (runtime.Info, error) {
	if !idRE.MatchString(id) {
		return runtime.Info{}, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	unlock := d.lock(id)
	defer unlock()
	return d.inspectLocked(ctx, id)
}

func (d *Driver) inspectLocked(ctx context.Context, id string) (runtime.Info, error) {
	st, exists, err := d.state(ctx, id)
	if err != nil {
		return runtime.Info{}, err
	}
	fi, dirErr := os.Stat(d.dir(id))
	if !exists {
		if dirErr != nil {
			return runtime.Info{}, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
		}
		info := runtime.Info{ID: id, State: runtime.StateStopped, Created: fi.ModTime()}
		if d.pausedOnDisk(id) {
			info.State = runtime.StatePaused
		}
		return info, nil
	}
	info := runtime.Info{ID: id, State: mapState(st.Status), Created: st.Created}
	if info.State != runtime.StateStopped || st.Status == "created" {
		info.Pid = st.Pid
	}
	return info, nil
}

// List implements runtime.Driver: the union of runtime containers under our
// --root and sandbox dirs (so checkpointed or crashed sandboxes show up too).
func (d *Driver) List(ctx context.Context) ([]runtime.Info, error) {
	states, err := d.listRetry(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []runtime.Info
	for _, st := range states {
		info := runtime.Info{ID: st.ID, State: mapState(st.Status), Created: st.Created}
		if info.State != runtime.StateStopped {
			info.Pid = st.Pid
		}
		seen[st.ID] = true
		out = append(out, info)
	}
	ents, err := os.ReadDir(d.cfg.SandboxDir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		if !e.IsDir() || seen[e.Name()] || !idRE.MatchString(e.Name()) {
			continue
		}
		info := runtime.Info{ID: e.Name(), State: runtime.StateStopped}
		if fi, err := e.Info(); err == nil {
			info.Created = fi.ModTime()
		}
		if d.pausedOnDisk(e.Name()) {
			info.State = runtime.StatePaused
		}
		out = append(out, info)
	}
	return out, nil
}

// Stats implements runtime.Driver from the sandbox's cgroup files.
func (d *Driver) Stats(ctx context.Context, id string) (runtime.Stats, error) {
	if !idRE.MatchString(id) || !d.exists(id) {
		return runtime.Stats{}, fmt.Errorf("%w: %s", runtime.ErrNotFound, id)
	}
	return readStats(d.cfg.CgroupParent, id)
}

// CgroupFile reads a file of the sandbox's cgroup for controller (v1 name,
// e.g. "memory", "pids"; on a pure cgroup v2 host the controller is ignored).
// Used by tests and diagnostics.
func (d *Driver) CgroupFile(id, controller, file string) ([]byte, error) {
	return os.ReadFile(filepath.Join(cgroupDir(controller, d.cfg.CgroupParent, id), file))
}

// ConsoleLog is the file that receives PID 1's stdout/stderr (append-only,
// survives pause/resume); the control plane serves it as sandbox logs.
func (d *Driver) ConsoleLog(id string) string { return filepath.Join(d.priv(id), "console.log") }

// bundle is the sandbox's OCI bundle (config.json, pid).
func (d *Driver) bundle(id string) string { return filepath.Join(d.priv(id), "bundle") }

// checkpointDir is where a runsc Pause keeps the memory image.
func (d *Driver) checkpointDir(id string) string { return filepath.Join(d.priv(id), "checkpoint") }

// netnsFile is the saved network config of a runsc sandbox (netsave.go).
func (d *Driver) netnsFile(id string) string { return filepath.Join(d.priv(id), "netns.json") }

// rootOnlyDir makes p a directory that only host root can enter, whatever
// was there: a non-directory (a planted link) is refused.
func rootOnlyDir(p string) error {
	if err := os.Mkdir(p, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	fi, err := os.Lstat(p)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%w: %s is not a directory", ErrConfig, p)
	}
	if err := os.Lchown(p, 0, 0); err != nil {
		return err
	}
	return os.Chmod(p, 0o700)
}

// UpperDir is the sandbox's writable overlay layer (what a snapshot keeps).
func (d *Driver) UpperDir(id string) string { return filepath.Join(d.diskDir(id), "upper") }

// CheckLeaks reports anything the driver may have left behind once every
// sandbox is deleted: containers under --root, sandbox dirs, mounts under
// SandboxDir and cgroups under CgroupParent. Used by tests and `cubicle doctor`.
func (d *Driver) CheckLeaks(ctx context.Context) error {
	var errs []error
	if l, err := d.list(ctx); err != nil {
		errs = append(errs, err)
	} else if len(l) > 0 {
		errs = append(errs, fmt.Errorf("oci: %d containers left under %s", len(l), d.cfg.StateDir))
	}
	for _, dir := range []string{d.cfg.SandboxDir, filepath.Join(d.cfg.SandboxDir, privateDir)} {
		ents, err := os.ReadDir(dir)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		ents = slices.DeleteFunc(ents, func(e os.DirEntry) bool { return e.Name() == privateDir })
		if len(ents) > 0 {
			errs = append(errs, fmt.Errorf("oci: %d entries left in %s", len(ents), dir))
		}
	}
	if mps, err := mountsUnder(d.cfg.SandboxDir); err != nil {
		errs = append(errs, err)
	} else if len(mps) > 0 {
		errs = append(errs, fmt.Errorf("oci: mounts left: %v", mps))
	}
	if loops := diskimage.LoopsUnder(d.cfg.SandboxDir); len(loops) > 0 {
		errs = append(errs, fmt.Errorf("oci: loop devices left: %v", loops))
	}
	if disks := d.cfg.Disks.DisksDir(); disks != "" {
		if ents, err := os.ReadDir(disks); err != nil {
			errs = append(errs, err)
		} else if len(ents) > 0 {
			errs = append(errs, fmt.Errorf("oci: %d disk images left in %s", len(ents), disks))
		}
		if loops := diskimage.LoopsUnder(disks); len(loops) > 0 {
			errs = append(errs, fmt.Errorf("oci: loop devices left: %v", loops))
		}
	}
	for _, h := range CgroupHierarchies() {
		ents, err := os.ReadDir(filepath.Join(h, d.cfg.CgroupParent))
		if err != nil {
			continue // parent never created in this hierarchy
		}
		for _, e := range ents {
			if e.IsDir() {
				errs = append(errs, fmt.Errorf("oci: cgroup left: %s", filepath.Join(h, d.cfg.CgroupParent, e.Name())))
			}
		}
	}
	return errors.Join(errs...)
}

// abortHostConns ends the host's connections to a stopped gVisor sandbox
// (see abortHostConns in netsave.go). A kernel without SOCK_DESTROY
// (CONFIG_INET_DIAG_DESTROY) leaves them; the proxy and node still keep a
// connection pool per sandbox, so only a restored sandbox's first request
// can then meet one.
func (d *Driver) abortHostConns(id string) {
	if d.cfg.Runtime != "runsc" {
		return // the kernel ends runc and crun containers' connections itself
	}
	if err := abortHostConns(d.netnsFile(id)); err != nil {
		abortWarn.Do(func() {
			slog.Warn("oci: could not abort host connections to a stopped gVisor sandbox", "sandbox", id, "err", err)
		})
	}
}

var abortWarn sync.Once

// restoreNetnsFor re-applies the saved netns config (see netsave.go), using
// the netns path recorded in the bundle.
func (d *Driver) restoreNetnsFor(id string) error {
	b, err := os.ReadFile(filepath.Join(d.bundle(id), "config.json"))
	if err != nil {
		return err
	}
	var sp struct {
		Linux struct {
			Namespaces []struct{ Type, Path string } `json:"namespaces"`
		} `json:"linux"`
	}
	if err := json.Unmarshal(b, &sp); err != nil {
		return err
	}
	for _, n := range sp.Linux.Namespaces {
		if n.Type == "network" && n.Path != "" {
			return restoreNetns(n.Path, d.netnsFile(id))
		}
	}
	return nil
}
