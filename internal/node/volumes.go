package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cubicle-dev/cubicle/internal/errdefs"
	"github.com/cubicle-dev/cubicle/internal/volume"
)

// VolumeAttachment asks a node to attach one volume for a holder.
type VolumeAttachment struct {
	VolumeID    string
	Driver      string
	PrivateData string
	Path        string // mount path inside the sandbox
	ReadOnly    bool
}

// Holder kinds of a node volume reference.
const (
	HolderSandbox = "sandbox"
	HolderContent = "content" // the volume-content API
)

// Reference states.
const (
	RefAttaching = "attaching" // recorded before the plugin's Attach runs
	RefAttached  = "attached"
)

// VolumeRef is the node's durable record of one holder of one volume. The
// node refcount passed to plugins is the number of refs for that volume.
type VolumeRef struct {
	VolumeID  string            `json:"volumeID"`
	Holder    string            `json:"holder"`
	Kind      string            `json:"kind"`
	Driver    string            `json:"driver"`
	State     string            `json:"state"`
	HostPath  string            `json:"hostPath,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Path      string            `json:"path,omitempty"`
	ReadOnly  bool              `json:"readOnly,omitempty"`
	UpdatedAt time.Time         `json:"updatedAt"`
}

// VolumeMetrics observes plugin calls; nil-safe.
type VolumeMetrics interface {
	PluginCall(driver, op string, d time.Duration, err error)
}

// volumes keeps the node's per-(volume, holder) refs on disk, one file
// each, written by rename before and after every plugin call, so refcounts
// survive a crash at any point and recovery knows what to detach.
type volumes struct {
	dir     string // <dir>/<volumeID>/<holder>.json
	baseDir string
	plugins func(driver string) (volume.Node, error)
	log     *slog.Logger
	metrics VolumeMetrics

	locks sync.Map // volumeID -> *sync.Mutex
}

// ErrVolumeDriver means the node has no plugin for a volume's driver.
var ErrVolumeDriver = errdefs.NewReason(errdefs.ErrInvalidArgument, "node_volume_driver_unknown", "node: no volume plugin registered for driver")

func (v *volumes) lock(id string) func() {
	mu, _ := v.locks.LoadOrStore(id, &sync.Mutex{})
	mu.(*sync.Mutex).Lock()
	return mu.(*sync.Mutex).Unlock
}

func (v *volumes) refPath(volID, holder string) string {
	return filepath.Join(v.dir, volID, holder+".json")
}

func (v *volumes) write(r *VolumeRef) error {
	r.UpdatedAt = time.Now().UTC()
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	p := v.refPath(r.VolumeID, r.Holder)
	if err := os.MkdirAll(filepath.Dir(p), 0o700); err != nil {
		return err
	}
	tmp := p + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}

func (v *volumes) remove(volID, holder string) error {
	if err := os.Remove(v.refPath(volID, holder)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	os.Remove(filepath.Join(v.dir, volID)) // only succeeds when empty
	return nil
}

func (v *volumes) refsOf(volID string) ([]*VolumeRef, error) {
	ents, err := os.ReadDir(filepath.Join(v.dir, volID))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []*VolumeRef
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), ".json") {
			continue
		}
		b, err := os.ReadFile(filepath.Join(v.dir, volID, e.Name()))
		if err != nil {
			return nil, err
		}
		var r VolumeRef
		if err := json.Unmarshal(b, &r); err != nil {
			// A torn write cannot happen (rename), so this is foreign junk.
			v.log.Warn("ignoring unreadable volume ref", "file", e.Name(), "err", err)
			continue
		}
		out = append(out, &r)
	}
	return out, nil
}

// list returns every ref on this node.
func (v *volumes) list() ([]VolumeRef, error) {
	ents, err := os.ReadDir(v.dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []VolumeRef
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		refs, err := v.refsOf(e.Name())
		if err != nil {
			return nil, err
		}
		for _, r := range refs {
			out = append(out, *r)
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].VolumeID != out[j].VolumeID {
			return out[i].VolumeID < out[j].VolumeID
		}
		return out[i].Holder < out[j].Holder
	})
	return out, nil
}

func (v *volumes) observe(driver, op string, start time.Time, err error) {
	if v.metrics != nil {
		v.metrics.PluginCall(driver, op, time.Since(start), err)
	}
}

// attach makes holder a reference of the volume and returns its host path.
// Re-attaching an attached holder is a no-op; any failure leaves the
// refcount as it was (the plugin is told to Detach what it may have done).
func (v *volumes) attach(ctx context.Context, holder, kind string, a VolumeAttachment) (string, error) {
	if err := volume.ValidateName(a.VolumeID); err != nil {
		return "", fmt.Errorf("volume id: %w", err)
	}
	p, err := v.plugins(a.Driver)
	if err != nil {
		return "", fmt.Errorf("%w %q (volume %s): %v", ErrVolumeDriver, a.Driver, a.VolumeID, err)
	}
	unlock := v.lock(a.VolumeID)
	defer unlock()
	refs, err := v.refsOf(a.VolumeID)
	if err != nil {
		return "", err
	}
	var others int64
	for _, r := range refs {
		if r.Holder != holder {
			others++
			continue
		}
		if r.State == RefAttached {
			if kind == HolderContent {
				// Rewritten, so its UpdatedAt says the holder still uses it.
				if err := v.write(r); err != nil {
					return "", err
				}
			}
			return r.HostPath, nil
		}
		// A half-done attach from before a crash: undo it first.
		if err := v.detachLocked(ctx, p, r, int64(len(refs)-1)); err != nil {
			return "", err
		}
	}
	ref := &VolumeRef{VolumeID: a.VolumeID, Holder: holder, Kind: kind, Driver: a.Driver, State: RefAttaching, Path: a.Path, ReadOnly: a.ReadOnly}
	if err := v.write(ref); err != nil {
		return "", err
	}
	start := time.Now()
	res, err := p.Attach(ctx, volume.AttachRequest{
		SandboxID: holder, Namespace: volume.Namespace, VolumeID: a.VolumeID,
		RefCount: others, VolumeBaseDir: v.baseDir, PrivateData: a.PrivateData,
	})
	if err == nil {
		err = volume.CheckHostPath(v.baseDir, res.HostPath)
		if err == nil {
			if fi, serr := os.Stat(res.HostPath); serr != nil || !fi.IsDir() {
				err = fmt.Errorf("%w: host_path %q is not a directory", volume.ErrProtocol, res.HostPath)
			}
		}
	}
	v.observe(a.Driver, "attach", start, err)
	if err != nil {
		ref.Metadata = res.Metadata
		if derr := v.detachLocked(context.WithoutCancel(ctx), p, ref, others); derr != nil {
			v.log.Error("rollback detach failed; the reconciler retries", "volume", a.VolumeID, "holder", holder, "err", derr)
		}
		return "", fmt.Errorf("attach volume %s (driver %s): %w", a.VolumeID, a.Driver, err)
	}
	ref.State, ref.HostPath, ref.Metadata = RefAttached, res.HostPath, res.Metadata
	if err := v.write(ref); err != nil {
		_ = v.detachLocked(context.WithoutCancel(ctx), p, ref, others)
		return "", err
	}
	return res.HostPath, nil
}

// detachLocked calls the plugin's Detach with the count that remains after
// it and drops the ref on success; on failure the ref stays for a retry.
func (v *volumes) detachLocked(ctx context.Context, p volume.Node, r *VolumeRef, after int64) error {
	start := time.Now()
	err := p.Detach(ctx, volume.DetachRequest{
		SandboxID: r.Holder, Namespace: volume.Namespace, VolumeID: r.VolumeID, RefCount: after, Metadata: r.Metadata,
	})
	v.observe(r.Driver, "detach", start, err)
	if err != nil {
		return fmt.Errorf("detach volume %s (driver %s): %w", r.VolumeID, r.Driver, err)
	}
	return v.remove(r.VolumeID, r.Holder)
}

// detach drops holder's reference to the volume; unknown refs are a no-op.
func (v *volumes) detach(ctx context.Context, holder, volID string) error {
	unlock := v.lock(volID)
	defer unlock()
	refs, err := v.refsOf(volID)
	if err != nil {
		return err
	}
	for _, r := range refs {
		if r.Holder != holder {
			continue
		}
		p, err := v.plugins(r.Driver)
		if err != nil {
			return fmt.Errorf("%w %q (volume %s): %v", ErrVolumeDriver, r.Driver, volID, err)
		}
		return v.detachLocked(ctx, p, r, int64(len(refs)-1))
	}
	return nil
}

// detachHolder drops every reference holder has.
func (v *volumes) detachHolder(ctx context.Context, holder string) error {
	refs, err := v.list()
	if err != nil {
		return err
	}
	var errs []error
	for _, r := range refs {
		if r.Holder == holder {
			errs = append(errs, v.detach(ctx, holder, r.VolumeID))
		}
	}
	return errors.Join(errs...)
}

// ErrVolumeNotAttached: the node holds no attached volume-content
// reference (AttachVolume) on the volume, so it serves none of its files.
var ErrVolumeNotAttached = errdefs.NewReason(errdefs.ErrFailedPrecondition, "node_volume_not_attached",
	"node: the volume is not attached on this node for file access")

// contentDir is the host path of volID's attached content reference: the
// only directory of a volume the node serves over its data plane.
func (v *volumes) contentDir(volID string) (string, error) {
	if err := volume.ValidateName(volID); err != nil {
		return "", fmt.Errorf("%w: volume id: %v", ErrVolumeNotAttached, err)
	}
	unlock := v.lock(volID)
	defer unlock()
	refs, err := v.refsOf(volID)
	if err != nil {
		return "", err
	}
	for _, r := range refs {
		if r.Kind == HolderContent && r.State == RefAttached && r.HostPath != "" {
			return r.HostPath, nil
		}
	}
	return "", fmt.Errorf("%w: volume %s", ErrVolumeNotAttached, volID)
}

// holders returns the sandbox holders with at least one ref.
func (v *volumes) sandboxHolders() (map[string]bool, error) {
	refs, err := v.list()
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, r := range refs {
		if r.Kind == HolderSandbox {
			out[r.Holder] = true
		}
	}
	return out, nil
}
