// Package binary drives binary-type volume plugins: an executable forked once
// per hook, given the hook's fields as --kebab-case flags, answering with one
// JSON object on stdout (see internal/volume/pluginmain for the plugin side).
package binary

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/cubicle-dev/cubicle/internal/volume"
)

const (
	// maxStdout bounds the answer; a real one is well under 2 KiB.
	maxStdout = 64 << 10
	// stderrTail is how much of stderr goes into an error message.
	stderrTail = 2 << 10
)

// Driver implements volume.Plugin by running an executable.
type Driver struct {
	path    string
	timeout time.Duration
}

var _ volume.Plugin = (*Driver)(nil)

// New returns a driver for the executable at path; each hook call is killed
// after timeout (volume.DefaultTimeout when timeout <= 0).
func New(path string, timeout time.Duration) *Driver {
	if timeout <= 0 {
		timeout = volume.DefaultTimeout
	}
	return &Driver{path: path, timeout: timeout}
}

// Create runs --op create.
func (d *Driver) Create(ctx context.Context, req volume.CreateRequest) (volume.CreateResult, error) {
	var out struct {
		Token       string `json:"token"`
		PrivateData string `json:"private_data"`
		Error       string `json:"error"`
	}
	err := d.run(ctx, "create", []string{"--op", "create", "--volume-id", req.VolumeID, "--name", req.Name}, &out, &out.Error)
	if err != nil {
		return volume.CreateResult{}, err
	}
	return volume.CreateResult{Token: out.Token, PrivateData: out.PrivateData}, nil
}

// Destroy runs --op destroy.
func (d *Driver) Destroy(ctx context.Context, req volume.DestroyRequest) error {
	var out struct {
		Error string `json:"error"`
	}
	return d.run(ctx, "destroy", []string{"--op", "destroy", "--volume-id", req.VolumeID}, &out, &out.Error)
}

// Attach runs --op attach; --private-data is passed only when non-empty.
func (d *Driver) Attach(ctx context.Context, req volume.AttachRequest) (volume.AttachResult, error) {
	args := []string{"--op", "attach",
		"--sandbox-id", req.SandboxID, "--namespace", req.Namespace,
		"--volume-id", req.VolumeID, "--ref-count", strconv.FormatInt(req.RefCount, 10),
		"--volume-base-dir", req.VolumeBaseDir}
	if req.PrivateData != "" {
		args = append(args, "--private-data", req.PrivateData)
	}
	var out struct {
		HostPath string            `json:"host_path"`
		Metadata map[string]string `json:"metadata"`
		Error    string            `json:"error"`
	}
	if err := d.run(ctx, "attach", args, &out, &out.Error); err != nil {
		return volume.AttachResult{}, err
	}
	return volume.AttachResult{HostPath: out.HostPath, Metadata: out.Metadata}, nil
}

// Detach runs --op detach with the attach metadata as a JSON object.
func (d *Driver) Detach(ctx context.Context, req volume.DetachRequest) error {
	md := req.Metadata
	if md == nil {
		md = map[string]string{}
	}
	mdJSON, err := json.Marshal(md)
	if err != nil {
		return fmt.Errorf("binary plugin %s: detach: encode metadata: %w", d.path, err)
	}
	var out struct {
		Error string `json:"error"`
	}
	return d.run(ctx, "detach", []string{"--op", "detach",
		"--sandbox-id", req.SandboxID, "--namespace", req.Namespace,
		"--volume-id", req.VolumeID, "--ref-count", strconv.FormatInt(req.RefCount, 10),
		"--metadata", string(mdJSON)}, &out, &out.Error)
}

// run executes one hook and decodes its answer into out; errField points at
// out's "error" member.
func (d *Driver) run(ctx context.Context, op string, args []string, out any, errField *string) error {
	// stdout and stderr are unlinked temp files rather than pipes: a plugin
	// that daemonizes (s3fs during attach) leaves a process holding them, and
	// with a pipe we would wait for that daemon to exit.
	stdout, err := tempFile()
	if err != nil {
		return fmt.Errorf("binary plugin %s: %s: %w", d.path, op, err)
	}
	defer stdout.Close()
	stderr, err := tempFile()
	if err != nil {
		return fmt.Errorf("binary plugin %s: %s: %w", d.path, op, err)
	}
	defer stderr.Close()

	cmd := exec.Command(d.path, args...)
	cmd.Stdout, cmd.Stderr = stdout, stderr
	// Own process group, so a timeout kills the helpers it spawned too.
	// Pdeathsig: a hook must not outlive the server that would act on its
	// answer; after a crash, recovery detaches whatever the hook left.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("%w: binary plugin %s: %s: %v", volume.ErrPlugin, d.path, op, err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	timer := time.NewTimer(d.timeout)
	defer timer.Stop()
	var waitErr error
	select {
	case waitErr = <-done:
	case <-timer.C:
		killGroup(cmd, done)
		return fmt.Errorf("%w: binary plugin %s: %s did not answer within %s", volume.ErrPluginTimeout, d.path, op, d.timeout)
	case <-ctx.Done():
		killGroup(cmd, done)
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return fmt.Errorf("%w: binary plugin %s: %s did not answer within %s: %w", volume.ErrPluginTimeout, d.path, op, time.Since(start).Round(time.Millisecond), ctx.Err())
		}
		return fmt.Errorf("binary plugin %s: %s: %w", d.path, op, ctx.Err())
	}

	outBytes, tooLong, err := readBounded(stdout, maxStdout)
	if err != nil {
		return fmt.Errorf("binary plugin %s: %s: read stdout: %w", d.path, op, err)
	}
	parseErr := decodeAnswer(outBytes, out)
	if tooLong {
		parseErr = fmt.Errorf("stdout is longer than %d bytes", maxStdout)
	}

	if waitErr != nil {
		// Prefer the plugin's own words; fall back to its stderr.
		msg := ""
		if parseErr == nil && *errField != "" {
			msg = *errField
		} else {
			msg = tail(stderr)
		}
		status := exitStatus(waitErr)
		if msg == "" {
			return fmt.Errorf("%w: binary plugin %s: %s: %s", volume.ErrPlugin, d.path, op, status)
		}
		return fmt.Errorf("%w: binary plugin %s: %s: %s: %s", volume.ErrPlugin, d.path, op, status, msg)
	}
	if parseErr != nil {
		if t := tail(stderr); t != "" {
			return fmt.Errorf("%w: binary plugin %s: %s: exited 0 but its stdout is not a JSON answer: %v (stderr: %s)", volume.ErrProtocol, d.path, op, parseErr, t)
		}
		return fmt.Errorf("%w: binary plugin %s: %s: exited 0 but its stdout is not a JSON answer: %v", volume.ErrProtocol, d.path, op, parseErr)
	}
	if *errField != "" {
		return fmt.Errorf("%w: binary plugin %s: %s: %s", volume.ErrPlugin, d.path, op, *errField)
	}
	return nil
}

// killGroup SIGKILLs the plugin's process group and reaps the plugin.
func killGroup(cmd *exec.Cmd, done <-chan error) {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

func tempFile() (*os.File, error) {
	f, err := os.CreateTemp("", "cubicle-volume-plugin-*")
	if err != nil {
		return nil, err
	}
	// Unlinked at once: nothing to clean up whatever happens next.
	_ = os.Remove(f.Name())
	return f, nil
}

func readBounded(f *os.File, limit int64) (data []byte, tooLong bool, err error) {
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return nil, false, err
	}
	data, err = io.ReadAll(io.LimitReader(f, limit+1))
	if err != nil {
		return nil, false, err
	}
	if int64(len(data)) > limit {
		return data[:limit], true, nil
	}
	return data, false, nil
}

// decodeAnswer parses the JSON object on stdout. Shell plugins sometimes log
// to stdout before answering, so when the whole output is not one object the
// last non-empty line is tried.
func decodeAnswer(data []byte, out any) error {
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 {
		return errors.New("stdout is empty")
	}
	err := decodeObject(trimmed, out)
	if err == nil {
		return nil
	}
	if i := bytes.LastIndexByte(trimmed, '\n'); i >= 0 {
		if decodeObject(bytes.TrimSpace(trimmed[i+1:]), out) == nil {
			return nil
		}
	}
	return fmt.Errorf("%v; stdout starts %q", err, truncate(trimmed, 200))
}

func decodeObject(b []byte, out any) error {
	if len(b) == 0 || b[0] != '{' {
		return errors.New("not a JSON object")
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(out); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("more than one JSON value")
	}
	return nil
}

func tail(f *os.File) string {
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	off := max(fi.Size()-stderrTail, 0)
	buf := make([]byte, fi.Size()-off)
	n, _ := f.ReadAt(buf, off)
	s := strings.TrimSpace(string(buf[:n]))
	if off > 0 {
		s = "…" + s
	}
	return s
}

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "…"
	}
	return string(b)
}

// exitStatus describes how the plugin ended; a crash must read as one.
func exitStatus(err error) string {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			name := unix.SignalName(ws.Signal())
			if name == "" {
				name = strconv.Itoa(int(ws.Signal()))
			}
			s := fmt.Sprintf("killed by signal %s (%s)", name, ws.Signal())
			if ws.CoreDump() {
				s += ", core dumped"
			}
			return s
		}
		return fmt.Sprintf("exit status %d", ee.ExitCode())
	}
	return err.Error()
}
