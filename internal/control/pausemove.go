package control

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/hostmount"
	"github.com/cubicle-dev/cubicle/internal/runtime"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/scheduler/storeledger"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// packagePause makes the pause that just completed movable: the node
// snapshots the paused sandbox (its upper layer; a runsc checkpoint too)
// into an internal snapshot and pushes it to the snapshot store, and the
// row records it as the current pause's package. It runs inside the pause
// call, under the sandbox's lock: a pause that returned is movable at
// once (no window in which a node loss strands it), and nothing can
// resume or pause the sandbox again meanwhile, so the package is always
// this pause's. A sandbox that could not move anyway (no store, booted by
// path, accelerators, a local-driver volume) is not packaged.
func (m *Manager) packagePause(ctx context.Context, id string, keepMemory bool) error {
	if m.cfg.SnapshotStore == nil {
		return nil
	}
	sb, err := m.store.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if sb.State != store.StatePaused || sb.Image == "" || hasAccelerators(sb) {
		return nil
	}
	if hasHostMounts(sb) {
		return nil // its host directories are on this node: it resumes here
	}
	if why, err := m.pinReason(ctx, &store.Snapshot{Node: m.rowNode(sb), Volumes: sb.Volumes}); err != nil || why != "" {
		return err
	}
	info, err := m.takeSnapshot(ctx, sb, "", true, true)
	if err != nil {
		return err
	}
	// Only creates name a snapshot's template; this one is the sandbox's.
	if err := m.store.DeleteTemplate(ctx, info.ID); err != nil && !errors.Is(err, store.ErrNotFound) {
		m.log.Warn("pause package: template row", "snapshot", info.ID, "err", err)
	}
	if len(info.Package) == 0 {
		m.SnapshotTrigger() // its files go with the next pass
		return fmt.Errorf("snapshot %s was not uploaded", info.ID)
	}
	sb.PausePackage = &store.PausePackage{SnapshotID: info.ID, FilesOnly: keepMemory && info.Kind != runtime.SnapshotMemory}
	if err := m.store.UpdateSandbox(ctx, sb); err != nil {
		m.SnapshotTrigger()
		return err
	}
	what := "its files"
	switch {
	case info.Kind == runtime.SnapshotMemory:
		what = "its files and memory"
	case keepMemory:
		what = "its files only (its memory stays in node " + m.rowNode(sb) + "'s RAM)"
	}
	m.event(ctx, id, "pause-packaged", "info", "the pause can resume on another node: %s in package %s", what, info.ID)
	return nil
}

// leavingReason is why a paused sandbox on nodeID should resume elsewhere
// when it can ("": resume it there): the operator cordoned or is
// draining the node.
func (m *Manager) leavingReason(ctx context.Context, nodeID string) string {
	row, err := m.store.GetNode(ctx, nodeID)
	if err != nil {
		return ""
	}
	switch {
	case row.Draining:
		return "node " + nodeID + " is draining"
	case row.Cordoned:
		return "node " + nodeID + " is cordoned"
	}
	return ""
}

// movePaused is why sb, paused or lost while paused, cannot resume on
// another node (nil: it can, from the returned snapshot). reboot: e2b's
// memory:false / onResume 'reboot', which lets a pause whose memory could
// not be packaged start afresh over its files. oldAnswers: its node is up
// (cordoned or draining), so it can confirm it let go of the volumes.
func (m *Manager) movePaused(ctx context.Context, sb *store.Sandbox, reboot, oldAnswers bool) (*store.Snapshot, error) {
	from := m.rowNode(sb)
	pinned := func(format string, a ...any) error {
		return fmt.Errorf("%w: sandbox '%s' cannot resume on a node other than %s: %s", ErrConflict, sb.ID, from, fmt.Sprintf(format, a...))
	}
	switch {
	case hasAccelerators(sb):
		return nil, pinned("it has accelerators")
	case hasHostMounts(sb):
		return nil, pinned("it mounts host directories of that node (%q)", hostmount.Key)
	case m.cfg.SnapshotStore == nil:
		return nil, pinned("%v", errNoSnapshotStore)
	case sb.Image == "":
		return nil, pinned("it booted from the control plane's paths (the embedded node), not by reference")
	}
	if why, err := m.pinReason(ctx, &store.Snapshot{Node: from, Volumes: sb.Volumes}); err != nil {
		return nil, err
	} else if why != "" {
		return nil, pinned("%s", why)
	}
	if len(sb.Volumes) > 0 && !oldAnswers {
		// The seed: a lost node's attachments are released only when it
		// confirms (or is forgotten); until then the volumes stay its.
		return nil, pinned("it mounts volumes, which node %s holds until it confirms their release (it returns, or `cubicle node forget %s`)", from, from)
	}
	pp := sb.PausePackage
	if pp == nil {
		return nil, pinned("its current pause has no package in the snapshot store (the upload failed or the pause predates it)")
	}
	if pp.FilesOnly && !reboot {
		return nil, pinned("its memory is frozen in node %s's RAM (runc keeps a paused sandbox's memory there; it cannot be packaged); connect with memory: false (onResume: 'reboot') to start it afresh over its files on another node", from)
	}
	sn, err := m.store.GetSnapshot(ctx, pp.SnapshotID)
	if err != nil {
		return nil, pinned("its pause package %s: %v", pp.SnapshotID, err)
	}
	if err := m.movable(ctx, sn); err != nil {
		return nil, pinned("%v", err)
	}
	return sn, nil
}

// resumeElsewhere boots paused (or lost) sandbox sb on another node from
// its pause package sn: placed like a create (policies, volume drivers,
// capacity reserved in the ledger; for its memory, the runtime that took
// it), the node fetches the chain and boots the sandbox with the same ID,
// token, env, network policy and metadata, restoring its memory when the
// package holds it and reboot is false. why is what made it move (an
// event names it). The old node's copy is deleted at once when that node
// answers (cordoned, draining), else when it returns (its row then names
// another node: nodeReturned, the reconcile).
//
// Volumes are attached through the new node's plugin, and the old node
// (which answers: movePaused refuses otherwise) deletes its copy, which
// detaches them there, before the attachment rows name the new node; a
// refusal there undoes the move, so the rows never hide a node's hold.
func (m *Manager) resumeElsewhere(ctx context.Context, sb *store.Sandbox, sn *store.Snapshot, reboot, oldAnswers bool, why string) (err error) {
	defer m.metrics.observe("resume-elsewhere", time.Now(), &err)
	from, prev := m.rowNode(sb), sb.State
	memory := sn.Kind == runtime.SnapshotMemory && !reboot
	tpl := template.Template{ID: sb.TemplateID, CPUCount: sb.CPUCount, MemoryMB: sb.MemoryMB, DiskSizeMB: sb.DiskSizeMB}
	mounts, err := m.mountsByName(ctx, sb.Volumes)
	if err != nil {
		return err
	}
	pr := placeRequest{sandboxID: sb.ID, pin: from, movable: true, exclude: map[string]bool{from: true},
		drivers: m.mountDrivers(ctx, sb.TeamID, mounts)}
	if memory {
		pr.runtime = sn.Runtime
	}
	// The reservation moves with it: released on the old node, taken on
	// the new one in the placement, and given back if the move fails.
	m.release(ctx, sb.ID)
	pl, err := m.place(ctx, CreateOptions{TeamID: sb.TeamID, Network: sb.Network}, tpl, pr)
	if err != nil {
		m.reserveBack(ctx, sb, from)
		return fmt.Errorf("sandbox '%s' cannot resume on node %s (%s) and found no other node: %w", sb.ID, from, why, err)
	}
	to := pl.nodeID
	undo := func() {
		if pl.reserved {
			m.release(ctx, sb.ID)
		}
		m.reserveBack(ctx, sb, from)
	}
	nctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	if err := m.checkNetworkOn(nctx, policyOf(sb.Network), pl.node, to); err != nil {
		undo()
		return err
	}
	if err := m.fetchChain(nctx, pl.node, to, sn); err != nil {
		undo()
		return err
	}
	boot, err := snapshotImage(sn, to)
	if err != nil {
		undo()
		return err
	}
	_, atts, err := m.resolveMounts(nctx, sb.TeamID, mounts, pl.node, to)
	if err != nil {
		undo()
		return err
	}
	req, err := m.nodeRequest(sb, sn.Layers)
	if err != nil {
		undo()
		return err
	}
	req.Volumes = atts
	byReference(&req, boot, sn.SnapshotLayers, memory)
	if memory {
		req.CurrentToken = sn.AgentToken
	}
	if _, err := m.store.CompareAndSetState(nctx, sb.ID, []store.SandboxState{prev}, store.StateResuming); err != nil {
		undo()
		return fmt.Errorf("%w: sandbox '%s' changed state", ErrConflict, sb.ID)
	}
	// The row names the new node before the node boots it, so a crash in
	// between leaves a row the reconcile judges on the right node.
	sb.Node, sb.State = to, store.StateResuming
	if err := m.store.UpdateSandbox(nctx, sb); err != nil {
		sb.Node, sb.State = from, prev
		_, _ = m.store.CompareAndSetState(nctx, sb.ID, []store.SandboxState{store.StateResuming}, prev)
		undo()
		return err
	}
	fail := func(err error) error {
		if derr := pl.node.Delete(nctx, sb.ID); derr != nil {
			m.log.Warn("resume elsewhere: cleanup", "sandbox", sb.ID, "node", to, "err", derr)
		}
		sb.Node, sb.State = from, prev
		if uerr := m.store.UpdateSandbox(nctx, sb); uerr != nil {
			m.log.Error("resume elsewhere: restoring the row", "sandbox", sb.ID, "err", uerr)
		}
		undo()
		m.event(ctx, sb.ID, "move-failed", "warn", "resuming on node %s (%s) failed: %v; the sandbox stays %s on node %s", to, why, err, prev, from)
		return fmt.Errorf("resume on node %s: %w", to, err)
	}
	placed, err := pl.node.Create(nctx, req)
	if err != nil {
		return fail(err)
	}
	if oldAnswers {
		// Its copy there goes now; with volumes, only its confirmed
		// detach lets the rows name the new node.
		old, derr := m.nodeFor(nctx, from)
		if derr == nil {
			dctx, dcancel := context.WithTimeout(nctx, 30*time.Second)
			derr = old.Delete(dctx, sb.ID)
			dcancel()
		}
		if derr != nil && len(sb.Volumes) > 0 {
			return fail(fmt.Errorf("node %s did not release the volumes: %w", from, derr))
		}
		if derr != nil {
			m.log.Warn("resume elsewhere: delete on the old node (the reconcile retries)", "sandbox", sb.ID, "node", from, "err", derr)
		}
	}
	if len(sb.Volumes) > 0 {
		// Past the old node's delete there is no going back: a row that
		// still names it only mislabels a hold the new node has (every
		// row still guards the volume, and goes when the sandbox does).
		if err := m.store.MoveVolumeAttachments(nctx, sb.ID, to); err != nil {
			m.log.Error("resume elsewhere: attachment rows still name the old node", "sandbox", sb.ID, "node", from, "err", err)
		}
		for _, vm := range sb.Volumes {
			m.volumeEvent(ctx, vm.VolumeID, sb.ID, "volume.attached", "info", "attached to sandbox %s on node %s at %s (moved from node %s, which released it)", sb.ID, to, vm.Path, from)
		}
	}
	sb.Addr = placed.Addr.String()
	sb.Layers, sb.SnapshotLayers = sn.Layers, sn.SnapshotLayers
	sb.PausePackage, sb.State = nil, store.StateRunning
	if err := m.store.UpdateSandbox(nctx, sb); err != nil {
		return err
	}
	how := "booted afresh over its files"
	if memory {
		how = "its memory restored"
	}
	m.event(ctx, sb.ID, "moved", "warn", "resumed on node %s, moved from node %s (%s): %s", to, from, why, how)
	return nil
}

// reserveBack takes sb's reservation on nodeID again after a move that
// did not happen (best effort: the row keeps counting in its node's
// ledger only through a reservation).
func (m *Manager) reserveBack(ctx context.Context, sb *store.Sandbox, nodeID string) {
	led := storeledger.New(m.store)
	r := scheduler.Resources{MilliCPU: int64(sb.CPUCount) * 1000, MemoryMiB: int64(sb.MemoryMB)}
	if err := led.Reserve(context.WithoutCancel(ctx), sb.ID, nodeID, r); err != nil && !errors.Is(err, store.ErrNotFound) {
		m.log.Warn("capacity ledger: reserving a sandbox that did not move", "sandbox", sb.ID, "node", nodeID, "err", err)
	}
}

// mountsByName is a row's mounts as a request names them: resolveMounts
// looks volumes up by name in the team, and only the default team's
// volumes have their name as ID.
func (m *Manager) mountsByName(ctx context.Context, vols []store.VolumeMount) ([]VolumeMount, error) {
	out := make([]VolumeMount, 0, len(vols))
	for _, vm := range vols {
		v, err := m.store.GetVolume(ctx, vm.VolumeID)
		if err != nil {
			return nil, fmt.Errorf("%w: its volume %s: %v", ErrConflict, vm.VolumeID, err)
		}
		out = append(out, VolumeMount{Name: v.Name, Path: vm.Path, ReadOnly: vm.ReadOnly})
	}
	return out, nil
}
