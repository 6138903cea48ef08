// Package nodetest is the conformance suite every node.Node runs: Local
// in-process today, the gRPC client over a bufconn (and a real node) once
// the node goes on the wire. It uses only the node.Node interface, so the
// same subtests are the finish line for every implementation.
package nodetest

import (
	"context"
	"crypto/rand"
	"errors"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/network"
	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/phase"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"golang.org/x/sys/unix"
)

// Options describe what the node under test is given.
type Options struct {
	// Layers are the read-only image layers every sandbox boots from; the
	// image must have bash (Run executes `bash -l -c`) and a user "user".
	Layers []string
	// NewVolume creates a fresh, empty volume on the control plane's half
	// of a volume driver the node has, ready to attach.
	NewVolume func(t *testing.T) node.VolumeAttachment
	// Snapshots: the node takes snapshots (its runtime can).
	Snapshots bool
	// Image, when set, is Layers' image as a reference the node resolves
	// itself (its Info says PullsImages); unset, the node boots from
	// layers only and refuses image references.
	Image node.Image
	// Timeout bounds each node call (default 60s).
	Timeout time.Duration
}

// Run runs the suite. newNode returns a fresh node (one per subtest) whose
// sandboxes the suite may create and delete; the caller cleans up the node
// itself. The suite runs on the node's host: Exits kills a sandbox's
// process by its host PID.
func Run(t *testing.T, newNode func(t *testing.T) node.Node, o Options) {
	if o.Timeout == 0 {
		o.Timeout = 60 * time.Second
	}
	s := &suite{o: o}
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, node.Node)
	}{
		{"Facts", s.facts},
		{"UnknownIDs", s.unknownIDs},
		{"Lifecycle", s.lifecycle},
		{"CreateTrace", s.createTrace},
		{"PauseResume", s.pauseResume},
		{"StopResume", s.stopResume},
		{"NetworkPolicy", s.networkPolicy},
		{"Logs", s.logs},
		{"Snapshots", s.snapshots},
		{"Volumes", s.volumes},
		{"Accelerators", s.accelerators},
		{"Exits", s.exits},
		{"Images", s.images},
	} {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newNode(t)) })
	}
}

type suite struct{ o Options }

func (s *suite) ctx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), s.o.Timeout)
	t.Cleanup(cancel)
	return ctx
}

// newID is a random 20-char [a-z0-9] id, the control plane's shape.
func newID(t *testing.T) string {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
	b := make([]byte, 20)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	for i := range b {
		b[i] = alphabet[int(b[i])%len(alphabet)]
	}
	return string(b)
}

func (s *suite) request(t *testing.T) node.CreateRequest {
	return node.CreateRequest{
		ID: newID(t), Layers: s.o.Layers, EnvdToken: newID(t), DefaultUser: "user",
		CPUCount: 1, MemoryMB: 256, DiskSizeMB: 256,
		EnvVars: map[string]string{"NODETEST": "yes"},
		Policy:  network.Policy{AllowInternet: false},
	}
}

// create starts a sandbox and deletes it when the test ends (a no-op when
// the test deleted it already).
func (s *suite) create(t *testing.T, n node.Node, req node.CreateRequest) node.Sandbox {
	t.Helper()
	sb, err := n.Create(s.ctx(t), req)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.o.Timeout)
		defer cancel()
		if err := n.Delete(ctx, req.ID); err != nil {
			t.Errorf("cleanup delete %s: %v", req.ID, err)
		}
	})
	if err != nil {
		t.Fatalf("Create: %v", err)
	}
	if sb.ID != req.ID || sb.State != runtime.StateRunning || !sb.Addr.IsValid() {
		t.Fatalf("Create returned %+v, want %s running with an address", sb, req.ID)
	}
	return sb
}

// createTrace: the phases a node runs reach the caller's trace (over the
// wire too, in the create answer), named for the node's runtime.
func (s *suite) createTrace(t *testing.T, n node.Node) {
	info, err := n.Info(s.ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	tr := phase.New()
	req := s.request(t)
	sb, err := n.Create(phase.With(s.ctx(t), tr), req)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), s.o.Timeout)
		defer cancel()
		if err := n.Delete(ctx, req.ID); err != nil {
			t.Errorf("cleanup delete %s: %v", req.ID, err)
		}
	})
	if err != nil || sb.State != runtime.StateRunning {
		t.Fatalf("Create: %+v, %v", sb, err)
	}
	got := map[string]bool{}
	for _, p := range tr.Phases() {
		if p.Duration < 0 || (p.Duration == 0 && p.Name != phase.LockWait && p.Name != phase.NetworkWait) {
			t.Errorf("phase %s took %v", p.Name, p.Duration)
		}
		got[p.Name] = true
	}
	for _, want := range []string{phase.LockWait, phase.Network, phase.Disk, phase.Rootfs, phase.OCIRun, phase.AgentReady, phase.Init} {
		if !got[want] {
			t.Errorf("no %s phase in %+v", want, tr.Phases())
		}
	}
	if tr.Runtime() != info.Runtime || tr.Runtime() == "" {
		t.Errorf("trace runtime %q, node runtime %q", tr.Runtime(), info.Runtime)
	}
	// Without a trace the create runs as before.
	plain := s.request(t)
	s.create(t, n, plain)
}

// run executes cmd as user and returns its exit code.
func (s *suite) run(t *testing.T, n node.Node, req node.CreateRequest, cmd string) int {
	t.Helper()
	code, err := n.Run(s.ctx(t), req.ID, req.EnvdToken, "user", cmd)
	if err != nil {
		t.Fatalf("Run %q: %v", cmd, err)
	}
	return code
}

func (s *suite) wantState(t *testing.T, n node.Node, id string, want runtime.State) {
	t.Helper()
	sb, err := n.Get(s.ctx(t), id)
	if err != nil {
		t.Fatalf("Get %s: %v", id, err)
	}
	if sb.State != want {
		t.Fatalf("Get %s: state %s, want %s", id, sb.State, want)
	}
}

func (s *suite) facts(t *testing.T, n node.Node) {
	info, err := n.Info(s.ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.ID == "" || info.Runtime == "" || info.Version == "" {
		t.Fatalf("Info lacks id, runtime or version: %+v", info)
	}
	if info.Capacity.CPUs <= 0 || info.Capacity.MemoryBytes == 0 {
		t.Fatalf("Info capacity %+v, want the host's CPUs and memory", info.Capacity)
	}
	if info.Abilities.Snapshots != s.o.Snapshots {
		t.Fatalf("Info.Abilities.Snapshots %v, want %v", info.Abilities.Snapshots, s.o.Snapshots)
	}
	if info.Abilities.MemorySnapshots && !info.Abilities.Snapshots {
		t.Fatal("memory snapshots without snapshots")
	}
	if s.o.NewVolume != nil {
		d := s.o.NewVolume(t).Driver
		if !slices.Contains(info.VolumeDrivers, d) {
			t.Fatalf("Info.VolumeDrivers %v lacks %q", info.VolumeDrivers, d)
		}
	}
}

// Every call on an ID the node never saw says so with node.ErrNotFound;
// Delete and DeleteSnapshot are idempotent and return nil.
func (s *suite) unknownIDs(t *testing.T, n node.Node) {
	ctx := s.ctx(t)
	id := newID(t)
	req := s.request(t)
	checks := map[string]error{}
	_, checks["Get"] = n.Get(ctx, id)
	checks["Pause"] = n.Pause(ctx, id)
	checks["Resume"] = n.Resume(ctx, id, req)
	checks["Reinit"] = n.Reinit(ctx, id, req, "")
	_, checks["Run"] = n.Run(ctx, id, "token", "user", "true")
	checks["UpdatePolicy"] = n.UpdatePolicy(ctx, id, network.Policy{})
	_, checks["Logs"] = n.Logs(ctx, id)
	_, checks["Stats"] = n.Stats(ctx, id, "token")
	checks["Rebuild"] = n.Rebuild(ctx, id, req)
	if s.o.Snapshots {
		checks["Stop"] = n.Stop(ctx, id)
		_, checks["Snapshot"] = n.Snapshot(ctx, id, newID(t))
	}
	for name, err := range checks {
		if !errors.Is(err, node.ErrNotFound) {
			t.Errorf("%s of an unknown sandbox: %v, want node.ErrNotFound", name, err)
		}
	}
	if err := n.Delete(ctx, id); err != nil {
		t.Errorf("Delete of an unknown sandbox: %v, want nil", err)
	}
	if err := n.DeleteSnapshot(ctx, newID(t)); err != nil {
		t.Errorf("DeleteSnapshot of an unknown snapshot: %v, want nil", err)
	}
	if err := n.DetachVolume(ctx, id, newID(t)); err != nil {
		t.Errorf("DetachVolume of an unknown reference: %v, want nil", err)
	}
}

func (s *suite) lifecycle(t *testing.T, n node.Node) {
	ctx := s.ctx(t)
	req := s.request(t)
	s.create(t, n, req)
	s.wantState(t, n, req.ID, runtime.StateRunning)
	l, err := n.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(l, func(sb node.Sandbox) bool { return sb.ID == req.ID && sb.State == runtime.StateRunning }) {
		t.Fatalf("List %+v lacks running %s", l, req.ID)
	}
	// The agent was initialised with the request's env, user and token.
	if c := s.run(t, n, req, `test "$NODETEST" = yes && test "$(id -un)" = user && exit 7`); c != 7 {
		t.Fatalf("Run: exit %d, want 7 (env, user or exit status lost)", c)
	}
	if _, err := n.Run(ctx, req.ID, "wrong-token", "user", "true"); err == nil {
		t.Fatal("Run with a wrong token succeeded")
	}
	if st, err := n.Stats(ctx, req.ID, req.EnvdToken); err != nil || st.MemTotal == 0 {
		t.Fatalf("Stats: %+v %v", st, err)
	}
	// Reinit hands the agent a new token, authorised by the current one.
	next := req
	next.EnvdToken = newID(t)
	if err := n.Reinit(ctx, req.ID, next, req.EnvdToken); err != nil {
		t.Fatalf("Reinit: %v", err)
	}
	if c := s.run(t, n, next, "true"); c != 0 {
		t.Fatalf("Run with the new token: exit %d", c)
	}
	if err := n.Delete(ctx, req.ID); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := n.Get(ctx, req.ID); !errors.Is(err, node.ErrNotFound) {
		t.Fatalf("Get after Delete: %v, want node.ErrNotFound", err)
	}
	if err := n.Delete(ctx, req.ID); err != nil {
		t.Fatalf("second Delete: %v, want nil", err)
	}
	l, err = n.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if slices.ContainsFunc(l, func(sb node.Sandbox) bool { return sb.ID == req.ID }) {
		t.Fatalf("List after Delete still has %s", req.ID)
	}
}

// Pause keeps memory: a process started before it is still there after.
func (s *suite) pauseResume(t *testing.T, n node.Node) {
	ctx := s.ctx(t)
	req := s.request(t)
	s.create(t, n, req)
	if c := s.run(t, n, req, "echo kept > /tmp/f; (setsid sleep 600 >/dev/null 2>&1 &) ; exit 0"); c != 0 {
		t.Fatalf("setup: exit %d", c)
	}
	if err := n.Pause(ctx, req.ID); err != nil {
		t.Fatalf("Pause: %v", err)
	}
	s.wantState(t, n, req.ID, runtime.StatePaused)
	if err := n.Resume(ctx, req.ID, req); err != nil {
		t.Fatalf("Resume: %v", err)
	}
	s.wantState(t, n, req.ID, runtime.StateRunning)
	if c := s.run(t, n, req, `test "$(cat /tmp/f)" = kept && pidof sleep >/dev/null`); c != 0 {
		t.Fatalf("after Resume: exit %d, want the file and the process kept", c)
	}
}

// Stop keeps files (not processes); Resume boots the sandbox afresh.
func (s *suite) stopResume(t *testing.T, n node.Node) {
	if !s.o.Snapshots {
		err := n.Stop(s.ctx(t), newID(t))
		if !errors.Is(err, node.ErrSnapshotUnsupported) {
			t.Fatalf("Stop on a node without snapshots: %v, want node.ErrSnapshotUnsupported", err)
		}
		return
	}
	ctx := s.ctx(t)
	req := s.request(t)
	s.create(t, n, req)
	if c := s.run(t, n, req, "echo kept > /home/user/f; (setsid sleep 600 >/dev/null 2>&1 &); exit 0"); c != 0 {
		t.Fatalf("setup: exit %d", c)
	}
	if err := n.Stop(ctx, req.ID); err != nil {
		t.Fatalf("Stop: %v", err)
	}
	// A stopped sandbox reads as paused (runtime.Driver's Stop): Resume
	// is how both come back.
	s.wantState(t, n, req.ID, runtime.StatePaused)
	if err := n.Resume(ctx, req.ID, req); err != nil {
		t.Fatalf("Resume after Stop: %v", err)
	}
	s.wantState(t, n, req.ID, runtime.StateRunning)
	if c := s.run(t, n, req, `test "$(cat /home/user/f)" = kept && ! pidof sleep >/dev/null`); c != 0 {
		t.Fatalf("after Resume: exit %d, want the file kept and the processes gone", c)
	}
}

func (s *suite) networkPolicy(t *testing.T, n node.Node) {
	ctx := s.ctx(t)
	req := s.request(t)
	s.create(t, n, req)
	p := network.Policy{AllowOut: []string{"192.0.2.0/24"}, DenyOut: []string{"198.51.100.0/24"}}
	if err := n.UpdatePolicy(ctx, req.ID, p); err != nil {
		t.Fatalf("UpdatePolicy: %v", err)
	}
	bad := network.Policy{AllowOut: []string{"not-a-cidr/99"}}
	if err := n.UpdatePolicy(ctx, req.ID, bad); err == nil {
		t.Fatal("UpdatePolicy accepted an invalid policy")
	}
	// The sandbox is unaffected by the refused update.
	if c := s.run(t, n, req, "true"); c != 0 {
		t.Fatalf("Run after UpdatePolicy: exit %d", c)
	}

	// A create whose network cannot be set up (that runs beside the
	// runtime's disk and rootfs) fails with the network's error and leaves
	// nothing behind: the same ID is created next.
	failed := s.request(t)
	failed.Policy = bad
	if _, err := n.Create(ctx, failed); !errors.Is(err, network.ErrInvalidPolicy) {
		t.Fatalf("Create with a policy the network refuses: %v, want network.ErrInvalidPolicy", err)
	}
	if _, err := n.Get(ctx, failed.ID); !errors.Is(err, node.ErrNotFound) {
		t.Fatalf("Get after the failed create: %v, want node.ErrNotFound", err)
	}
	failed.Policy = network.Policy{}
	s.create(t, n, failed)
	if c := s.run(t, n, failed, "true"); c != 0 {
		t.Fatalf("Run in the sandbox created after the failure: exit %d", c)
	}
}

func (s *suite) logs(t *testing.T, n node.Node) {
	ctx := s.ctx(t)
	req := s.request(t)
	s.create(t, n, req)
	if _, err := n.Logs(ctx, req.ID); err != nil {
		t.Fatalf("Logs of a running sandbox: %v", err)
	}
	if err := n.Delete(ctx, req.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Logs(ctx, req.ID); !errors.Is(err, node.ErrNotFound) {
		t.Fatalf("Logs after Delete: %v, want node.ErrNotFound", err)
	}
}

// A snapshot outlives its sandbox: another sandbox is rebuilt from it and
// sees the files; deleting it is idempotent.
func (s *suite) snapshots(t *testing.T, n node.Node) {
	ctx := s.ctx(t)
	if !s.o.Snapshots {
		_, err := n.Snapshot(ctx, newID(t), newID(t))
		if !errors.Is(err, node.ErrSnapshotUnsupported) {
			t.Fatalf("Snapshot on a node without snapshots: %v, want node.ErrSnapshotUnsupported", err)
		}
		return
	}
	req := s.request(t)
	s.create(t, n, req)
	if c := s.run(t, n, req, "echo from-snapshot > /home/user/f"); c != 0 {
		t.Fatalf("setup: exit %d", c)
	}
	snapID := newID(t)
	t.Cleanup(func() { _ = n.DeleteSnapshot(context.Background(), snapID) })
	if _, err := n.Snapshot(ctx, req.ID, "../"+snapID); err == nil {
		t.Fatal("Snapshot accepted a path-like snapshot ID")
	}
	snap, err := n.Snapshot(ctx, req.ID, snapID)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if snap.ID != snapID || (snap.Kind != runtime.SnapshotFilesystem && snap.Kind != runtime.SnapshotMemory) {
		t.Fatalf("Snapshot returned %+v", snap)
	}
	s.wantState(t, n, req.ID, runtime.StateRunning)
	ids, err := n.Snapshots(ctx)
	if err != nil || !slices.Contains(ids, snapID) {
		t.Fatalf("Snapshots: %v %v, want %s listed", ids, err, snapID)
	}
	if err := n.Delete(ctx, req.ID); err != nil {
		t.Fatal(err)
	}

	other := s.request(t)
	s.create(t, n, other)
	if c := s.run(t, n, other, "test -e /home/user/f"); c == 0 {
		t.Fatal("a fresh sandbox already has the snapshot's file")
	}
	// A reboot takes every mount down: a layer that is one (a clone of
	// the disk) is mounted again before it is stacked, by path or by ID.
	reboot := func() {
		t.Helper()
		if err := unix.Unmount(snap.Layer, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			t.Fatalf("unmount the snapshot's layer: %v", err)
		}
	}
	reboot()
	rb := other
	rb.Layers = append([]string{snap.Layer}, s.o.Layers...)
	rb.EnvdToken = newID(t)
	rb.CurrentToken = other.EnvdToken
	if err := n.Rebuild(ctx, other.ID, rb); err != nil {
		t.Fatalf("Rebuild: %v", err)
	}
	if c := s.run(t, n, rb, `test "$(cat /home/user/f)" = from-snapshot`); c != 0 {
		t.Fatalf("after Rebuild: exit %d, want the snapshot's file", c)
	}

	// The same by snapshot ID, which the node resolves in its own
	// snapshot dir (over its image where it pulls images).
	byID := s.request(t)
	byID.SnapshotLayers = []string{snapID}
	if !s.o.Image.IsZero() {
		byID.Layers, byID.Image = nil, s.o.Image
	}
	missing := byID
	missing.SnapshotLayers = []string{newID(t)}
	if _, err := n.Create(ctx, missing); !errors.Is(err, node.ErrSnapshotNotFound) {
		t.Fatalf("Create from an unknown snapshot ID: %v, want node.ErrSnapshotNotFound", err)
	}
	notTop := byID
	notTop.RestoreSnapshot = newID(t)
	if _, err := n.Create(ctx, notTop); !errors.Is(err, node.ErrImageRequest) {
		t.Fatalf("Create restoring a snapshot that is not its top layer: %v, want node.ErrImageRequest", err)
	}
	reboot()
	s.create(t, n, byID)
	if c := s.run(t, n, byID, `test "$(cat /home/user/f)" = from-snapshot`); c != 0 {
		t.Fatalf("created from snapshot ID %s: exit %d, want the snapshot's file", snapID, c)
	}
	if err := n.Delete(ctx, byID.ID); err != nil {
		t.Fatal(err)
	}

	if err := n.DeleteSnapshot(ctx, snapID); err != nil {
		t.Fatalf("DeleteSnapshot: %v", err)
	}
	ids, err = n.Snapshots(ctx)
	if err != nil || slices.Contains(ids, snapID) {
		t.Fatalf("Snapshots after DeleteSnapshot: %v %v", ids, err)
	}
	if err := n.DeleteSnapshot(ctx, snapID); err != nil {
		t.Fatalf("second DeleteSnapshot: %v, want nil", err)
	}
}

func hasRef(refs []node.VolumeRef, volumeID, holder string) bool {
	return slices.ContainsFunc(refs, func(r node.VolumeRef) bool { return r.VolumeID == volumeID && r.Holder == holder })
}

// A sandbox and a content holder each hold a reference; data written by
// one sandbox is there for the next; references go with their holders.
func (s *suite) volumes(t *testing.T, n node.Node) {
	if s.o.NewVolume == nil {
		t.Fatal("Options.NewVolume is required: every node attaches volumes")
	}
	ctx := s.ctx(t)
	vol := s.o.NewVolume(t)
	vol.Path = "/data"
	holder := "content-" + newID(t)
	if _, err := n.AttachVolume(ctx, holder, vol); err != nil {
		t.Fatalf("AttachVolume: %v", err)
	}
	t.Cleanup(func() { _ = n.DetachVolume(context.Background(), holder, vol.VolumeID) })
	if _, err := n.AttachVolume(ctx, holder, vol); err != nil {
		t.Fatalf("second AttachVolume of the same holder: %v, want a no-op", err)
	}

	a := s.request(t)
	a.Volumes = []node.VolumeAttachment{vol}
	s.create(t, n, a)
	if c := s.run(t, n, a, "echo shared > /data/f"); c != 0 {
		t.Fatalf("write to the volume: exit %d", c)
	}
	refs, err := n.VolumeRefs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !hasRef(refs, vol.VolumeID, holder) || !hasRef(refs, vol.VolumeID, a.ID) {
		t.Fatalf("VolumeRefs %+v, want refs of %s and %s on %s", refs, holder, a.ID, vol.VolumeID)
	}
	if err := n.Delete(ctx, a.ID); err != nil {
		t.Fatal(err)
	}
	if refs, _ := n.VolumeRefs(ctx); hasRef(refs, vol.VolumeID, a.ID) {
		t.Fatalf("Delete left the sandbox's volume ref: %+v", refs)
	}

	b := s.request(t)
	ro := vol
	ro.ReadOnly = true
	b.Volumes = []node.VolumeAttachment{ro}
	s.create(t, n, b)
	if c := s.run(t, n, b, `test "$(cat /data/f)" = shared && ! touch /data/g 2>/dev/null`); c != 0 {
		t.Fatalf("read-only mount in the next sandbox: exit %d, want the data and no writes", c)
	}
	if err := n.DetachVolume(ctx, holder, vol.VolumeID); err != nil {
		t.Fatalf("DetachVolume: %v", err)
	}
	if err := n.DetachVolume(ctx, holder, vol.VolumeID); err != nil {
		t.Fatalf("second DetachVolume: %v, want nil", err)
	}
	refs, err = n.VolumeRefs(ctx)
	if err != nil || hasRef(refs, vol.VolumeID, holder) || !hasRef(refs, vol.VolumeID, b.ID) {
		t.Fatalf("VolumeRefs after DetachVolume: %+v %v", refs, err)
	}
	bad := vol
	bad.Driver = "no-such-driver"
	if _, err := n.AttachVolume(ctx, "content-"+newID(t), bad); err == nil {
		t.Fatal("AttachVolume with an unknown driver succeeded")
	}
}

// The accelerator service agrees with Info; unknown devices are
// accel.ErrNotFound, and a request no device could ever match is
// accel.ErrIncompatible.
func (s *suite) accelerators(t *testing.T, n node.Node) {
	ctx := s.ctx(t)
	info, err := n.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inv, err := n.AcceleratorInventory(ctx)
	if err != nil {
		t.Fatal(err)
	}
	total := 0
	for _, c := range info.Accelerators {
		total += c
	}
	if len(inv) != total {
		t.Fatalf("inventory has %d devices, Info counts %d", len(inv), total)
	}
	for _, d := range inv {
		got, err := n.Accelerator(ctx, d.ID)
		if err != nil || got.ID != d.ID {
			t.Fatalf("Accelerator(%s): %+v %v", d.ID, got, err)
		}
	}
	unknown := "gpu-0000:ff:1f.7"
	if _, err := n.Accelerator(ctx, unknown); !errors.Is(err, accel.ErrNotFound) {
		t.Fatalf("Accelerator of an unknown device: %v, want accel.ErrNotFound", err)
	}
	if _, err := n.DisableAccelerator(ctx, unknown, "test"); !errors.Is(err, accel.ErrNotFound) {
		t.Fatalf("DisableAccelerator of an unknown device: %v, want accel.ErrNotFound", err)
	}
	if _, err := n.EnableAccelerator(ctx, unknown); !errors.Is(err, accel.ErrNotFound) {
		t.Fatalf("EnableAccelerator of an unknown device: %v, want accel.ErrNotFound", err)
	}
	if _, err := n.RecoverAccelerator(ctx, unknown); !errors.Is(err, accel.ErrNotFound) {
		t.Fatalf("RecoverAccelerator of an unknown device: %v, want accel.ErrNotFound", err)
	}
	if err := n.DenyAccelerators(ctx, "", errors.New("nodetest denial")); err != nil {
		t.Fatalf("DenyAccelerators: %v", err)
	}
	if _, err := n.AcceleratorEvents(ctx, 10); err != nil {
		t.Fatalf("AcceleratorEvents: %v", err)
	}
}

// A sandbox whose process dies is reported on Exits (by a node that
// watches) and no longer reads as running.
func (s *suite) exits(t *testing.T, n node.Node) {
	ctx := s.ctx(t)
	exits, err := n.Exits(ctx)
	if err != nil {
		t.Fatal(err)
	}
	req := s.request(t)
	sb := s.create(t, n, req)
	if sb.Pid <= 0 {
		t.Fatalf("Create returned pid %d", sb.Pid)
	}
	if err := syscall.Kill(sb.Pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill %d: %v", sb.Pid, err)
	}
	if exits != nil {
		select {
		case e := <-exits:
			if e.ID != req.ID || e.Pid != sb.Pid || e.At.IsZero() {
				t.Fatalf("exit %+v, want %s pid %d with a time", e, req.ID, sb.Pid)
			}
		case <-ctx.Done():
			t.Fatalf("no exit reported for %s", req.ID)
		}
	}
	got, err := n.Get(ctx, req.ID)
	if err != nil {
		t.Fatalf("Get after the death: %v", err)
	}
	if got.State == runtime.StateRunning {
		t.Fatalf("Get after the death: %+v, want not running", got)
	}
}

// A create names layers or an image, never both. A node with an image
// source (Info.Abilities.PullsImages) pulls an image and boots from the
// reference as from its layers; one without refuses the reference.
func (s *suite) images(t *testing.T, n node.Node) {
	ctx := s.ctx(t)
	info, err := n.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Abilities.PullsImages != !s.o.Image.IsZero() {
		t.Fatalf("Info.Abilities.PullsImages %v, want %v", info.Abilities.PullsImages, !s.o.Image.IsZero())
	}
	im := s.o.Image
	if im.IsZero() {
		im = node.Image{Name: "base"}
	}
	both := s.request(t)
	both.Image = im
	if _, err := n.Create(ctx, both); !errors.Is(err, node.ErrImageRequest) {
		t.Fatalf("Create with layers and an image: %v, want node.ErrImageRequest", err)
	}
	byImage := s.request(t)
	byImage.Layers, byImage.Image = nil, im
	if err := n.PullImage(ctx, node.Image{}); !errors.Is(err, node.ErrImageRequest) {
		t.Fatalf("PullImage of no image: %v, want node.ErrImageRequest", err)
	}
	if s.o.Image.IsZero() {
		if err := n.PullImage(ctx, im); !errors.Is(err, node.ErrImagesUnsupported) {
			t.Fatalf("PullImage on a node without an image source: %v, want node.ErrImagesUnsupported", err)
		}
		if _, err := n.Create(ctx, byImage); !errors.Is(err, node.ErrImagesUnsupported) {
			t.Fatalf("Create by image on a node without an image source: %v, want node.ErrImagesUnsupported", err)
		}
		if l, err := n.List(ctx); err != nil || len(l) != 0 {
			t.Fatalf("refused creates left sandboxes: %v %v", l, err)
		}
		return
	}
	// A prefetch, then the create from it (a cache hit).
	if err := n.PullImage(ctx, im); err != nil {
		t.Fatalf("PullImage %v: %v", im, err)
	}
	s.create(t, n, byImage)
	if code := s.run(t, n, byImage, `test -x /bin/bash && id -un | grep -qx user`); code != 0 {
		t.Fatalf("a sandbox booted by image reference: exit %d", code)
	}
	if err := n.Delete(ctx, byImage.ID); err != nil {
		t.Fatal(err)
	}
}
