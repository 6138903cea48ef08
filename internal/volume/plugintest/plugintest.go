// Package plugintest checks that a volume plugin follows the protocol, by
// driving one volume through its whole life the way the control plane and a
// node would. Go tests use Run; `cubicle volume plugin-test` uses Check and
// prints the Report.
package plugintest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/cubicle-dev/cubicle/internal/volume"
	"github.com/cubicle-dev/cubicle/internal/volume/internal/mountinfo"
)

// Sandbox ids the checker attaches as.
const (
	SandboxA = "plugintest-a"
	SandboxB = "plugintest-b"
	SandboxC = "plugintest-c"
)

// Options tunes Check.
type Options struct {
	// BaseDir is the volume_plugin_base_dir passed to Attach; host_path must
	// be inside it. Created if missing. Empty: a temporary directory.
	BaseDir string
	// VolumeID of the test volume. Empty: "plugintest-<random>".
	VolumeID string
	// ProbeFiles writes a file through the first attach's host_path and reads
	// it through the second's, then re-attaches after the last detach and
	// checks the file survived (detach must keep the data).
	ProbeFiles bool
	// SizeMB is the size of the sized volume the checker makes, with
	// ProbeFiles, when the plugin is volume.Sized (default 8): it fills it
	// through host_path and expects ENOSPC, with the files written before
	// kept.
	SizeMB int
}

// Step is one hook call (or check) the checker made.
type Step struct {
	Name     string
	Duration time.Duration
	Err      error
}

// Report is Check's verdict.
type Report struct {
	Steps      []Step
	Violations []string
}

// OK reports whether the plugin passed.
func (r *Report) OK() bool { return len(r.Violations) == 0 }

// Write prints the report for a person.
func (r *Report) Write(w io.Writer) error {
	var b strings.Builder
	for _, s := range r.Steps {
		res := "ok  "
		if s.Err != nil {
			res = "FAIL"
		}
		fmt.Fprintf(&b, "%s %-28s %8s", res, s.Name, s.Duration.Round(time.Millisecond))
		if s.Err != nil {
			fmt.Fprintf(&b, "  %v", s.Err)
		}
		b.WriteByte('\n')
	}
	if r.OK() {
		b.WriteString("PASS: no protocol violations\n")
	} else {
		fmt.Fprintf(&b, "FAIL: %d protocol violation(s):\n", len(r.Violations))
		for _, v := range r.Violations {
			fmt.Fprintf(&b, "  - %s\n", v)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *Report) String() string {
	var b strings.Builder
	_ = r.Write(&b)
	return b.String()
}

type checker struct {
	ctx  context.Context
	p    volume.Plugin
	opts Options
	r    *Report
}

func (c *checker) violate(format string, a ...any) {
	c.r.Violations = append(c.r.Violations, fmt.Sprintf(format, a...))
}

// step runs fn, records it, and reports a hook error as a violation.
func (c *checker) step(name string, fn func() error) error {
	start := time.Now()
	err := fn()
	c.r.Steps = append(c.r.Steps, Step{Name: name, Duration: time.Since(start), Err: err})
	if err != nil {
		c.violate("%s failed: %v", name, err)
	}
	return err
}

// Check runs create → attach(0, a) → attach(1, b) → detach(b, 1) →
// detach(a, 0) → destroy → destroy again against p and reports every
// protocol violation it sees. After a failed step it still detaches and
// destroys what it set up.
func Check(ctx context.Context, p volume.Plugin, opts Options) *Report {
	c := &checker{ctx: ctx, p: p, opts: opts, r: &Report{}}
	if c.opts.VolumeID == "" {
		c.opts.VolumeID = "plugintest-" + randHex(6)
	}
	if c.opts.BaseDir == "" {
		dir, err := os.MkdirTemp("", "plugintest-base-")
		if err != nil {
			c.violate("cannot make a base dir: %v", err)
			return c.r
		}
		c.opts.BaseDir = dir
		// os.Remove, not RemoveAll: a mount the plugin left behind must not
		// have its contents deleted through it.
		defer os.Remove(dir)
	} else if err := os.MkdirAll(c.opts.BaseDir, 0o755); err != nil {
		c.violate("cannot make base dir %s: %v", c.opts.BaseDir, err)
		return c.r
	}
	c.run()
	return c.r
}

func (c *checker) run() {
	id := c.opts.VolumeID
	var created volume.CreateResult
	if c.step("create", func() (err error) {
		created, err = c.p.Create(c.ctx, volume.CreateRequest{VolumeID: id, Name: id})
		return err
	}) != nil {
		// A failed create may have left something behind.
		c.cleanupDestroy()
		return
	}
	if n := len(created.PrivateData); n > volume.MaxPrivateData {
		c.violate("create returned private_data of %d bytes, more than %d", n, volume.MaxPrivateData)
	}
	c.destroyAfter(c.attachPhase(created.PrivateData))
	if sz, ok := c.p.(volume.Sized); ok && sz.EnforcesSize() && c.opts.ProbeFiles {
		c.sizePhase()
	}
}

// sizePhase checks a sized volume: a write past its size fails with
// ENOSPC, the files written before survive it (and a detach), removing a
// file gives the space back, and destroy leaves nothing mounted.
func (c *checker) sizePhase() {
	size := c.opts.SizeMB
	if size <= 0 {
		size = 8
	}
	id := c.opts.VolumeID + "-sized"
	att := func(sandbox string) (volume.AttachResult, error) {
		return c.p.Attach(c.ctx, volume.AttachRequest{SandboxID: sandbox, Namespace: volume.Namespace, VolumeID: id,
			VolumeBaseDir: c.opts.BaseDir})
	}
	det := func(sandbox string, md map[string]string) error {
		return c.p.Detach(c.ctx, volume.DetachRequest{SandboxID: sandbox, Namespace: volume.Namespace, VolumeID: id, Metadata: md})
	}
	defer c.cleanup("destroy sized (cleanup)", func(ctx context.Context) error {
		return c.p.Destroy(ctx, volume.DestroyRequest{VolumeID: id})
	})
	if c.step(fmt.Sprintf("create sized (%d MiB)", size), func() error {
		_, err := c.p.Create(c.ctx, volume.CreateRequest{VolumeID: id, Name: id, SizeMB: size})
		return err
	}) != nil {
		return
	}
	var a volume.AttachResult
	if c.step("attach sized", func() (err error) { a, err = att(SandboxA); return err }) != nil {
		c.cleanup("detach sized (cleanup)", func(context.Context) error { return det(SandboxA, nil) })
		return
	}
	keep := filepath.Join(a.HostPath, "keep")
	keepData := "plugintest " + randHex(16) + "\n"
	fillErr := c.step("write past the size: ENOSPC", func() error {
		if err := os.WriteFile(keep, []byte(keepData), 0o644); err != nil {
			return fmt.Errorf("write a small file first: %w", err)
		}
		err := fill(filepath.Join(a.HostPath, "fill"), int64(size+1)<<20)
		if err == nil {
			return fmt.Errorf("wrote %d MiB into a %d MiB volume: the size is not enforced", size+1, size)
		}
		if !errors.Is(err, syscall.ENOSPC) && !errors.Is(err, syscall.EDQUOT) {
			return fmt.Errorf("writing past the size failed with %v, want ENOSPC", err)
		}
		if got, err := os.ReadFile(keep); err != nil || string(got) != keepData {
			return fmt.Errorf("the file written before the volume filled is gone or changed: %v", err)
		}
		if err := os.Remove(filepath.Join(a.HostPath, "fill")); err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(a.HostPath, "after"), make([]byte, 1<<20), 0o644); err != nil {
			return fmt.Errorf("removing the filler did not give the space back: %w", err)
		}
		return nil
	})
	if c.step("detach sized", func() error { return det(SandboxA, a.Metadata) }) != nil {
		return
	}
	if still, _ := mountinfo.IsMountpoint(a.HostPath); still {
		c.violate("detach(refCount=0) left the sized volume mounted at %q", a.HostPath)
	}
	if fillErr == nil {
		var b volume.AttachResult
		if c.step("re-attach sized", func() (err error) { b, err = att(SandboxB); return err }) == nil {
			if got, err := os.ReadFile(filepath.Join(b.HostPath, "keep")); err != nil || string(got) != keepData {
				c.violate("after filling the sized volume and re-attaching it, the file written first is gone or changed: %v", err)
			}
			c.step("detach sized again", func() error { return det(SandboxB, b.Metadata) })
		}
	}
	c.step("destroy sized", func() error { return c.p.Destroy(c.ctx, volume.DestroyRequest{VolumeID: id}) })
}

// fill writes n bytes of zeros to path and syncs them, so a size limit
// enforced at writeback shows up as an error here.
func fill(path string, n int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for n > 0 && err == nil {
		var w int
		w, err = f.Write(buf[:min(int64(len(buf)), n)])
		n -= int64(w)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// attachPhase runs the attach/detach part; it returns whether the volume's
// teardown may go on normally (false: detach failed, destroy is cleanup).
func (c *checker) attachPhase(priv string) bool {
	id := c.opts.VolumeID
	attach := func(name, sandbox string, rc int64) (volume.AttachResult, bool) {
		var res volume.AttachResult
		err := c.step(name, func() (err error) {
			res, err = c.p.Attach(c.ctx, volume.AttachRequest{
				SandboxID: sandbox, Namespace: volume.Namespace, VolumeID: id,
				RefCount: rc, VolumeBaseDir: c.opts.BaseDir, PrivateData: priv,
			})
			return err
		})
		if err != nil {
			return res, false
		}
		c.checkAttach(name, res)
		return res, true
	}
	detach := func(name, sandbox string, rc int64, md map[string]string) bool {
		return c.step(name, func() error {
			return c.p.Detach(c.ctx, volume.DetachRequest{
				SandboxID: sandbox, Namespace: volume.Namespace, VolumeID: id,
				RefCount: rc, Metadata: md,
			})
		}) == nil
	}

	a, ok := attach("attach(a, refCount=0)", SandboxA, 0)
	if !ok {
		// The plugin may have mounted half-way; ask it to undo, as the node's
		// rollback would.
		c.cleanup("detach(a) (cleanup)", func(ctx context.Context) error {
			return c.p.Detach(ctx, volume.DetachRequest{SandboxID: SandboxA, Namespace: volume.Namespace,
				VolumeID: id, Metadata: map[string]string{}})
		})
		return true
	}
	wasMount, _ := mountinfo.IsMountpoint(a.HostPath)

	b, okB := attach("attach(b, refCount=1)", SandboxB, 1)
	var probe, probeData string
	if okB {
		if b.HostPath != a.HostPath {
			c.violate("attach(refCount=1) returned host_path %q, attach(refCount=0) returned %q: a later sandbox must get the existing host_path", b.HostPath, a.HostPath)
		}
		if c.opts.ProbeFiles && a.HostPath != "" && b.HostPath != "" {
			probe, probeData = c.probe(a.HostPath, b.HostPath)
		}
		detach("detach(b, refCount=1)", SandboxB, 1, b.Metadata)
		// refCount>0 is a no-op: the first sandbox must still see its files.
		if _, err := os.Stat(a.HostPath); err != nil {
			c.violate("after detach(refCount=1), host_path %q is gone (%v): only the last detach may tear down", a.HostPath, err)
		}
	}
	if !detach("detach(a, refCount=0)", SandboxA, 0, a.Metadata) {
		return false
	}
	if wasMount {
		if still, _ := mountinfo.IsMountpoint(a.HostPath); still {
			c.violate("detach(refCount=0) left %q mounted", a.HostPath)
		}
	}
	if probe != "" {
		c.checkSurvives(attach, detach, probe, probeData)
	}
	return true
}

// checkAttach applies the per-answer rules to an attach result.
func (c *checker) checkAttach(name string, res volume.AttachResult) {
	switch {
	case res.HostPath == "":
		c.violate("%s returned an empty host_path", name)
		return
	case !filepath.IsAbs(res.HostPath):
		c.violate("%s returned host_path %q, which is not absolute", name, res.HostPath)
		return
	}
	if err := volume.CheckHostPath(c.opts.BaseDir, res.HostPath); err != nil {
		c.violate("%s: %v", name, err)
	}
	if fi, err := os.Stat(res.HostPath); err != nil {
		c.violate("%s returned host_path %q, which does not exist: %v", name, res.HostPath, err)
	} else if !fi.IsDir() {
		c.violate("%s returned host_path %q, which is not a directory", name, res.HostPath)
	}
	for k, v := range res.Metadata {
		// Metadata is stored and sent to Detach as JSON; invalid UTF-8
		// would come back altered.
		if !utf8.ValidString(k) || !utf8.ValidString(v) {
			c.violate("%s returned metadata %q=%q that is not valid UTF-8, so it does not survive JSON", name, k, v)
		}
	}
}

// probe writes a file through one host path and reads it through the other.
func (c *checker) probe(writeDir, readDir string) (name, data string) {
	name = ".plugintest-" + randHex(6)
	data = "plugintest " + randHex(16) + "\n"
	err := c.step("probe file", func() error {
		if err := os.WriteFile(filepath.Join(writeDir, name), []byte(data), 0o644); err != nil {
			return fmt.Errorf("write through first host_path: %w", err)
		}
		got, err := os.ReadFile(filepath.Join(readDir, name))
		if err != nil {
			return fmt.Errorf("file written through attach(refCount=0)'s host_path is not readable through attach(refCount=1)'s: %w", err)
		}
		if string(got) != data {
			return fmt.Errorf("file read back through the second host_path has different content")
		}
		return nil
	})
	if err != nil {
		return "", ""
	}
	return name, data
}

// checkSurvives re-attaches and checks the probe file is still there:
// detach must keep the volume's data.
func (c *checker) checkSurvives(attach func(string, string, int64) (volume.AttachResult, bool), detach func(string, string, int64, map[string]string) bool, name, data string) {
	res, ok := attach("re-attach(c, refCount=0)", SandboxC, 0)
	if !ok {
		return
	}
	if res.HostPath != "" {
		got, err := os.ReadFile(filepath.Join(res.HostPath, name))
		if err != nil || string(got) != data {
			c.violate("after the last detach and a new attach the probe file is gone or changed (detach must not delete data): %v", err)
		}
		_ = os.Remove(filepath.Join(res.HostPath, name))
	}
	detach("detach(c, refCount=0)", SandboxC, 0, res.Metadata)
}

func (c *checker) destroyAfter(teardownOK bool) {
	id := c.opts.VolumeID
	if !teardownOK {
		c.cleanupDestroy()
		return
	}
	if c.step("destroy", func() error {
		return c.p.Destroy(c.ctx, volume.DestroyRequest{VolumeID: id})
	}) != nil {
		return
	}
	start := time.Now()
	err := c.p.Destroy(c.ctx, volume.DestroyRequest{VolumeID: id})
	c.r.Steps = append(c.r.Steps, Step{Name: "destroy again", Duration: time.Since(start), Err: err})
	if err != nil {
		c.violate("destroy of an already destroyed volume failed (destroy must be idempotent): %v", err)
	}
}

// cleanupDestroy destroys after an earlier failure; its own failure is
// recorded but is not a further violation.
func (c *checker) cleanupDestroy() {
	c.cleanup("destroy (cleanup)", func(ctx context.Context) error {
		return c.p.Destroy(ctx, volume.DestroyRequest{VolumeID: c.opts.VolumeID})
	})
}

// cleanup runs fn even when the caller's context has been cancelled (an
// interrupted `plugin-test` must still tidy up), and records it without
// counting a failure as a violation.
func (c *checker) cleanup(name string, fn func(context.Context) error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), 2*time.Minute)
	defer cancel()
	start := time.Now()
	err := fn(ctx)
	c.r.Steps = append(c.r.Steps, Step{Name: name, Duration: time.Since(start), Err: err})
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// Run checks p and fails t with the report when there are violations.
func Run(t testing.TB, p volume.Plugin, opts Options) {
	t.Helper()
	r := Check(t.Context(), p, opts)
	if !r.OK() {
		t.Errorf("volume plugin conformance:\n%s", r)
		return
	}
	t.Logf("volume plugin conformance:\n%s", r)
}
