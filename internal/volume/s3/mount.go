package s3

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/cubicle-dev/cubicle/internal/volume"
)

// FSType is how s3fs mounts appear in /proc/self/mountinfo.
const FSType = "fuse.s3fs"

// Attach mounts the volume's prefix at <volume_base_dir>/s3-<id> on the first
// attach on this node and returns the mount for later ones. A live mount
// left by an earlier plugin process (crash, restart) is reused; a dead one
// (s3fs gone, "transport endpoint is not connected") is replaced.
func (p *Plugin) Attach(ctx context.Context, req volume.AttachRequest) (volume.AttachResult, error) {
	if err := validateID(req.VolumeID); err != nil {
		return volume.AttachResult{}, err
	}
	prefix, err := p.attachPrefix(req)
	if err != nil {
		return volume.AttachResult{}, err
	}
	base, err := p.baseDir(req.VolumeBaseDir)
	if err != nil {
		return volume.AttachResult{}, err
	}
	dir := filepath.Join(base, MountDirPrefix+req.VolumeID)

	unlock, err := p.lock(ctx, req.VolumeID)
	if err != nil {
		return volume.AttachResult{}, err
	}
	defer unlock()

	res := volume.AttachResult{HostPath: dir, Metadata: map[string]string{
		"mount_dir": dir,
		"bucket":    p.cfg.Bucket,
		"prefix":    prefix,
	}}
	mounted, err := isMounted(dir)
	if err != nil {
		return volume.AttachResult{}, err
	}
	if mounted {
		perr := probe(dir, time.Until(deadline(ctx, time.Duration(p.cfg.MountTimeout))))
		if perr == nil {
			return res, nil
		}
		// Dead FUSE mount: clear it so a fresh s3fs can take the path.
		if err := p.unmount(ctx, dir); err != nil {
			return volume.AttachResult{}, fmt.Errorf("%w: stale mount at %s (%v) could not be cleared: %v", ErrMount, dir, perr, err)
		}
	}
	if err := p.mount(ctx, dir, prefix, req.VolumeID); err != nil {
		return volume.AttachResult{}, err
	}
	return res, nil
}

// attachPrefix picks the object prefix: private_data from Create when
// given (so a later prefix change in the config keeps old volumes
// reachable), else the configured layout.
func (p *Plugin) attachPrefix(req volume.AttachRequest) (string, error) {
	if req.PrivateData == "" {
		return p.volumePrefix(req.VolumeID), nil
	}
	pd := strings.TrimLeft(req.PrivateData, "/")
	if !strings.HasSuffix(pd, "/") {
		pd += "/"
	}
	if !validKeyPath(pd) {
		return "", fmt.Errorf("%w: private_data %q is not an object prefix", ErrInvalidRequest, req.PrivateData)
	}
	return pd, nil
}

// baseDir resolves volume_base_dir (creating it) and refuses one that
// contains the state dir: the credentials file must never be reachable
// through a sandbox's bind mount.
func (p *Plugin) baseDir(b string) (string, error) {
	if b == "" {
		b = volume.DefaultBaseDir
	}
	if !filepath.IsAbs(b) {
		return "", fmt.Errorf("%w: volume_base_dir %q is not absolute", ErrInvalidRequest, b)
	}
	if err := os.MkdirAll(b, 0o755); err != nil {
		return "", fmt.Errorf("%w: volume_base_dir: %v", ErrMount, err)
	}
	// mountinfo shows resolved paths; compare like with like.
	resolved, err := filepath.EvalSymlinks(b)
	if err != nil {
		return "", fmt.Errorf("%w: volume_base_dir: %v", ErrMount, err)
	}
	state, err := filepath.Abs(p.cfg.StateDir)
	if err != nil {
		return "", fmt.Errorf("%w: state_dir: %v", ErrInvalidConfig, err)
	}
	if rs, err := filepath.EvalSymlinks(state); err == nil {
		state = rs
	}
	if within(resolved, state) || within(state, resolved) {
		return "", fmt.Errorf("%w: state_dir %q and volume_base_dir %q overlap; credentials would be exposed to sandboxes", ErrInvalidConfig, p.cfg.StateDir, b)
	}
	return resolved, nil
}

// within reports whether path is parent or below it.
func within(parent, path string) bool {
	rel, err := filepath.Rel(parent, path)
	return err == nil && rel != ".." && !strings.HasPrefix(rel, "../")
}

// Detach unmounts on the last detach on this node and removes the mount
// point. Backend data is never touched. Unknown or already-detached volumes
// succeed.
func (p *Plugin) Detach(ctx context.Context, req volume.DetachRequest) error {
	if err := validateID(req.VolumeID); err != nil {
		return err
	}
	if req.RefCount > 0 {
		return nil
	}
	unlock, err := p.lock(ctx, req.VolumeID)
	if err != nil {
		return err
	}
	defer unlock()

	want := MountDirPrefix + req.VolumeID
	var dirs []string
	if d := req.Metadata["mount_dir"]; d != "" {
		// Metadata round-trips through the caller; only ever act on a path
		// shaped like one this plugin made.
		if !filepath.IsAbs(d) || filepath.Base(d) != want {
			return fmt.Errorf("%w: metadata mount_dir %q is not a %s mount point", ErrInvalidRequest, d, want)
		}
		dirs = append(dirs, filepath.Clean(d))
	} else {
		// No metadata (older caller, lost state): find our mount by name.
		mounts, err := readMounts()
		if err != nil {
			return err
		}
		for _, m := range mounts {
			if m.FSType == FSType && filepath.Base(m.MountPoint) == want {
				dirs = append(dirs, m.MountPoint)
			}
		}
	}
	for _, dir := range dirs {
		if err := p.unmount(ctx, dir); err != nil {
			return err
		}
		if err := os.Remove(dir); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%w: remove mount point %s: %v", ErrUnmount, dir, err)
		}
	}
	return nil
}

// lock serialises hooks for one volume across plugin processes (binary
// mode forks one per hook) and goroutines (rpc mode): flock locks belong to
// the open file description, so each call's own open excludes the others.
func (p *Plugin) lock(ctx context.Context, id string) (func(), error) {
	dir := filepath.Join(p.cfg.StateDir, "locks")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("%w: state dir: %v", ErrMount, err)
	}
	f, err := os.OpenFile(filepath.Join(dir, id+".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("%w: lock: %v", ErrMount, err)
	}
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return func() { f.Close() }, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			f.Close()
			return nil, fmt.Errorf("%w: lock: %v", ErrMount, err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			return nil, fmt.Errorf("%w: waiting for volume %s lock: %v", volume.ErrPluginTimeout, id, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// writePasswd writes s3fs's "AK:SK" credentials file (0600; s3fs refuses
// group/other-readable ones) atomically, so a concurrent mount never reads
// a half-written file.
func (p *Plugin) writePasswd() (string, error) {
	if err := os.MkdirAll(p.cfg.StateDir, 0o700); err != nil {
		return "", fmt.Errorf("%w: state dir: %v", ErrMount, err)
	}
	path := filepath.Join(p.cfg.StateDir, "passwd-s3fs")
	tmp, err := os.CreateTemp(p.cfg.StateDir, ".passwd-*")
	if err != nil {
		return "", fmt.Errorf("%w: credentials file: %v", ErrMount, err)
	}
	defer os.Remove(tmp.Name())
	_, err = tmp.WriteString(p.cfg.AccessKey + ":" + p.cfg.SecretKey + "\n")
	if err == nil {
		err = tmp.Chmod(0o600)
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), path)
	}
	if err != nil {
		return "", fmt.Errorf("%w: credentials file: %v", ErrMount, err)
	}
	return path, nil
}

// S3FSArgs is the s3fs command line for mounting prefix at dir (exported for
// the README and tests).
func (p *Plugin) S3FSArgs(prefix, dir, passwd, logFile string) []string {
	src := p.cfg.Bucket + ":/" + strings.TrimSuffix(prefix, "/")
	opts := []string{
		"url=" + strings.TrimSuffix(p.cfg.Endpoint, "/"),
		"endpoint=" + p.cfg.Region, // SigV4 signing region
		"sigv4",                    // no silent fallback to V2 on auth errors
		"passwd_file=" + passwd,
		// Cubelet's virtiofs daemon and the sandbox's users are not
		// necessarily the mounting user; files get full modes so any
		// sandbox user can work in the volume.
		"allow_other",
		"umask=0000",
		"mp_umask=0000",
		// Objects written by other S3 clients have no x-amz-meta-mode;
		// without this they show up as mode 0000.
		"complement_stat",
		// Fail fast on a dead endpoint (s3fs defaults to 5 retries)
		// so the mount timeout is what bounds Attach.
		"retries=2",
		"connect_timeout=10",
		"dbglevel=warn",
		"logfile=" + logFile,
	}
	if p.cfg.UsePathStyle() {
		opts = append(opts, "use_path_request_style")
	}
	if p.cfg.InsecureSkipVerify {
		opts = append(opts, "no_check_certificate", "ssl_verify_hostname=0")
	}
	opts = append(opts, p.cfg.S3FSOptions...)
	args := []string{src, dir}
	for _, o := range opts {
		args = append(args, "-o", o)
	}
	return args
}

// mount starts s3fs and waits until the mount answers. On any failure it
// leaves neither a mount nor the mount point behind.
func (p *Plugin) mount(ctx context.Context, dir, prefix, id string) (err error) {
	passwd, err := p.writePasswd()
	if err != nil {
		return err
	}
	logDir := filepath.Join(p.cfg.StateDir, "logs")
	if err := os.MkdirAll(logDir, 0o700); err != nil {
		return fmt.Errorf("%w: log dir: %v", ErrMount, err)
	}
	logPath := filepath.Join(logDir, "s3fs-"+id+".log")
	// One log per mount session: the previous s3fs for this volume is gone.
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("%w: log file: %v", ErrMount, err)
	}
	defer logFile.Close()

	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("%w: mount point: %v", ErrMount, err)
	}
	defer func() {
		if err != nil {
			p.cleanupFailedMount(dir)
		}
	}()

	args := p.S3FSArgs(prefix, dir, passwd, logPath)
	cmd := exec.Command(p.cfg.S3FS, args...)
	// s3fs forks a daemon that must outlive this process and must not hold
	// the caller's stdout pipe (the binary driver reads it to EOF): give it
	// /dev/null and a file, and its own session so a signal to our process
	// group does not take the mount down.
	cmd.Stdin = nil
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}

	timeout := time.Duration(p.cfg.MountTimeout)
	dl := deadline(ctx, timeout)
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%w: start %s: %v", ErrMount, p.cfg.S3FS, err)
	}
	// The foreground s3fs exits once the FUSE mount exists and the daemon
	// has forked; it reports option and credential-file errors itself.
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait() }()
	select {
	case werr := <-waitErr:
		if werr != nil {
			return fmt.Errorf("%w: s3fs %s: %v: %s", ErrMount, dir, werr, tail(logPath))
		}
	case <-time.After(time.Until(dl)):
		_ = cmd.Process.Kill()
		<-waitErr
		return fmt.Errorf("%w: s3fs did not daemonize within %s: %s", ErrMountTimeout, timeout, tail(logPath))
	}

	// Wait for the mount, then for it to answer: s3fs checks the bucket in
	// its FUSE init, which the first stat waits on; a bad endpoint or key
	// makes that stat fail and s3fs exit.
	for {
		mounted, err := isMounted(dir)
		if err != nil {
			return err
		}
		if mounted {
			break
		}
		if len(s3fsPIDs(dir)) == 0 {
			return fmt.Errorf("%w: s3fs exited before %s was mounted: %s", ErrMount, dir, tail(logPath))
		}
		if time.Now().After(dl) {
			return fmt.Errorf("%w: %s not mounted after %s: %s", ErrMountTimeout, dir, timeout, tail(logPath))
		}
		time.Sleep(20 * time.Millisecond)
	}
	check := func() error {
		if err := probe(dir, time.Until(dl)); err != nil {
			if errors.Is(err, errProbeTimeout) {
				return fmt.Errorf("%w: %s did not answer within %s: %s", ErrMountTimeout, dir, timeout, tail(logPath))
			}
			return fmt.Errorf("%w: %s: %v: %s", ErrMount, dir, err, tail(logPath))
		}
		return nil
	}
	if err := check(); err != nil {
		return err
	}
	// s3fs checks the bucket and keys in its FUSE init and, on failure,
	// stops its loop; a request already queued can still be answered (and
	// s3fs answers a 403 lookup with ENOENT), so a first probe can pass on
	// a mount that is about to go away. Give it time to go, then look again.
	time.Sleep(settleDelay)
	if mounted, err := isMounted(dir); err != nil {
		return err
	} else if !mounted || len(s3fsPIDs(dir)) == 0 {
		return fmt.Errorf("%w: s3fs exited right after mounting %s: %s", ErrMount, dir, tail(logPath))
	}
	return check()
}

// settleDelay is how long a fresh mount must stay up before Attach trusts it.
const settleDelay = 150 * time.Millisecond

// cleanupFailedMount removes whatever a failed mount left: a lingering
// (possibly still retrying) mount, its daemon, and the mount point.
func (p *Plugin) cleanupFailedMount(dir string) {
	if mounted, _ := isMounted(dir); mounted {
		_ = syscall.Unmount(dir, syscall.MNT_DETACH)
	}
	// Kill, then wait for it to go: a signalled process still shows its
	// command line until it has died.
	for dl := time.Now().Add(2 * time.Second); time.Now().Before(dl); time.Sleep(20 * time.Millisecond) {
		pids := s3fsPIDs(dir)
		if len(pids) == 0 {
			break
		}
		for _, pid := range pids {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	_ = os.Remove(dir)
}

var errProbeTimeout = errors.New("mount did not answer")

// probe checks that the mount answers with the backend's authority: it
// looks up a name that cannot exist, which s3fs turns into HEAD requests.
// Only ENOENT (the server said 404) counts as healthy: a dead s3fs gives
// ENOTCONN/ECONNABORTED, wrong keys EPERM/EACCES, an unreachable endpoint
// EIO. (Listing the root would prove less and cost a HEAD per entry.) A hung
// FUSE call cannot be cancelled, so it runs in a goroutine that is
// abandoned on timeout; it returns once the mount is torn down.
func probe(dir string, d time.Duration) error {
	if d <= 0 {
		d = time.Second
	}
	name := filepath.Join(dir, ".cubicle-probe-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	done := make(chan error, 1)
	go func() {
		if _, err := os.Stat(dir); err != nil {
			done <- err
			return
		}
		_, err := os.Lstat(name)
		switch {
		case errors.Is(err, os.ErrNotExist):
			done <- nil
		case err == nil:
			done <- fmt.Errorf("probe name %s unexpectedly exists", name)
		default:
			done <- err
		}
	}()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		return errProbeTimeout
	}
}

// unmount takes every mount at dir down: a clean unmount first (flushes and
// lets s3fs exit), retried while busy until unmount_timeout, then a lazy
// one so Detach never wedges the node's sandbox teardown.
func (p *Plugin) unmount(ctx context.Context, dir string) error {
	dl := deadline(ctx, time.Duration(p.cfg.UnmountTimeout))
	giveUp := dl.Add(time.Duration(p.cfg.UnmountTimeout))
	lazy := false
	for {
		if time.Now().After(giveUp) {
			return fmt.Errorf("%w: %s is still mounted after a lazy unmount", ErrUnmount, dir)
		}
		mounted, err := isMounted(dir)
		if err != nil {
			return err
		}
		if !mounted {
			// s3fs exits shortly after its mount goes; wait for it so
			// Detach returns with nothing of the volume left running.
			for len(s3fsPIDs(dir)) > 0 && time.Now().Before(dl) {
				time.Sleep(20 * time.Millisecond)
			}
			return nil
		}
		flags := 0
		if lazy {
			flags = syscall.MNT_DETACH
		}
		err = syscall.Unmount(dir, flags)
		switch {
		case err == nil, errors.Is(err, syscall.EINVAL), errors.Is(err, syscall.ENOENT):
			// EINVAL: not a mount point any more (raced with s3fs exiting).
		case errors.Is(err, syscall.EPERM):
			// Unprivileged plugin: fusermount is setuid and may unmount
			// FUSE mounts its user owns.
			if out, ferr := fusermount(dir, lazy); ferr != nil {
				return fmt.Errorf("%w: %s: %v: %s", ErrUnmount, dir, ferr, strings.TrimSpace(string(out)))
			}
		case errors.Is(err, syscall.EBUSY):
			if time.Now().After(dl) {
				lazy = true
			}
			time.Sleep(50 * time.Millisecond)
		default:
			return fmt.Errorf("%w: %s: %v", ErrUnmount, dir, err)
		}
		if lazy && err == nil {
			return nil
		}
	}
}

func fusermount(dir string, lazy bool) ([]byte, error) {
	args := []string{"-u"}
	if lazy {
		args = append(args, "-z")
	}
	args = append(args, dir)
	var lastErr error
	for _, bin := range []string{"fusermount3", "fusermount"} {
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err == nil || !errors.Is(err, exec.ErrNotFound) {
			return out, err
		}
		lastErr = err
	}
	return nil, lastErr
}

// Mount is one /proc/self/mountinfo entry.
type Mount struct {
	MountPoint string
	FSType     string
	Source     string
}

// ReadMounts parses /proc/self/mountinfo (this process's mount namespace,
// which for a binary plugin is Cubelet's).
func ReadMounts() ([]Mount, error) { return readMounts() }

func readMounts() ([]Mount, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", volume.ErrPlugin, err)
	}
	defer f.Close()
	var out []Mount
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	for sc.Scan() {
		// id parent maj:min root mountpoint opts [optional...] - fstype source superopts
		fields := strings.Fields(sc.Text())
		sep := -1
		for i := 6; i < len(fields); i++ {
			if fields[i] == "-" {
				sep = i
				break
			}
		}
		if len(fields) < 5 || sep < 0 || sep+2 >= len(fields) {
			continue
		}
		out = append(out, Mount{
			MountPoint: unescapeMount(fields[4]),
			FSType:     fields[sep+1],
			Source:     unescapeMount(fields[sep+2]),
		})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: mountinfo: %v", volume.ErrPlugin, err)
	}
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for space, …).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// isMounted reports whether an s3fs mount sits at dir.
func isMounted(dir string) (bool, error) {
	mounts, err := readMounts()
	if err != nil {
		return false, err
	}
	dir = filepath.Clean(dir)
	for _, m := range mounts {
		if m.MountPoint == dir && m.FSType == FSType {
			return true, nil
		}
	}
	return false, nil
}

// s3fsPIDs finds s3fs processes serving dir by their command line. Used
// after a failed mount, when a daemon may still be retrying a dead
// endpoint with no mount left to unmount.
func s3fsPIDs(dir string) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() {
			continue
		}
		raw, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		args := strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00")
		if len(args) < 3 || filepath.Base(args[0]) != "s3fs" {
			continue
		}
		for _, a := range args[1:] {
			if a == dir {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}

// tail returns the end of an s3fs log for error messages.
func tail(path string) string {
	const max = 2048
	b, err := os.ReadFile(path)
	if err != nil {
		return "(no s3fs log)"
	}
	s := strings.TrimSpace(string(b))
	if len(s) > max {
		s = "…" + s[len(s)-max:]
	}
	if s == "" {
		return "(s3fs log empty)"
	}
	return "s3fs log: " + s
}
