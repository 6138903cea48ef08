package control

import (
	"context"
	"encoding/json"
	"errors"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// ErrAccelUnsupported: an operation GPU sandboxes do not support (pause,
// snapshot, clone — physical devices cannot be checkpointed).
var ErrAccelUnsupported = errors.New("not supported for sandboxes with accelerators")

// accelRequest merges the sandbox's accelerator request with the
// template's contract (nil when it needs none). Whether a node can serve
// it is decided by place.
func (m *Manager) accelRequest(o CreateOptions, tpl template.Template) ([]accel.Request, error) {
	if len(o.Accelerators) == 0 && tpl.Accelerators == nil {
		return nil, nil
	}
	if len(o.Accelerators) > 1 {
		return nil, invalid("accelerators: one request per sandbox (got %d)", len(o.Accelerators))
	}
	var req *accel.Request
	if len(o.Accelerators) == 1 {
		req = &o.Accelerators[0]
		if err := accel.ValidateRequest(*req); err != nil {
			return nil, invalid("accelerators: %v", err)
		}
	}
	eff, err := accel.Effective(req, tpl.Accelerators)
	if err != nil {
		return nil, err
	}
	return []accel.Request{eff}, nil
}

// place is the scheduling stage: the scheduler picks the node, among the
// nodes that report state (today the one in-process node). It fails fast
// as a single node would: *accel.CompatError naming the layer when no
// device could ever match, accel.ErrNoCapacity when all matching ones are
// in use. The team's and the template's placement policies apply
// (placementPolicies); a node refused by one is named in the no-fit
// error. The in-process node reports no CPU or memory capacity (its
// admission is MaxSandboxes and the disk budget), so no resources are
// asked of it.
func (m *Manager) place(ctx context.Context, o CreateOptions, tpl template.Template, accels []accel.Request) (string, error) {
	req := &scheduler.Request{TeamID: o.TeamID, TemplateID: tpl.ID, Contract: tpl.Accelerators}
	if len(accels) == 1 {
		req.Accelerator = &accels[0]
	}
	pols, err := m.placementPolicies(ctx, o.TeamID, tpl.ID)
	if err != nil {
		return "", err
	}
	req.Policies = pols
	info, err := m.nodeInfo(ctx)
	if err != nil {
		return "", err
	}
	n, err := m.schedulerNode(ctx, info)
	if err != nil {
		return "", err
	}
	nodes := []scheduler.Node{n}
	if err := m.fillStandbys(ctx, tpl, nodes); err != nil {
		return "", err
	}
	cands, err := m.sched.Place(req, nodes)
	if err != nil {
		var nf *scheduler.NoFitError
		if errors.As(err, &nf) && nf.Accel != nil {
			err = nf.Accel
		}
		if info.Accelerators != nil {
			if derr := m.node.DenyAccelerators(ctx, "", err); derr != nil {
				m.log.Error("recording an accelerator denial", "err", derr)
			}
		}
		return "", err
	}
	return cands[0].NodeID, nil
}

func accelJSON(r []accel.Request) string {
	if len(r) == 0 {
		return ""
	}
	b, _ := json.Marshal(r)
	return string(b)
}

// hasAccelerators reports whether a sandbox row holds devices.
func hasAccelerators(sb *store.Sandbox) bool { return sb.Accelerators != "" }

// SandboxAccelerators decodes a row's requests.
func SandboxAccelerators(sb *store.Sandbox) []accel.Request {
	if sb.Accelerators == "" {
		return nil
	}
	var r []accel.Request
	_ = json.Unmarshal([]byte(sb.Accelerators), &r)
	return r
}
