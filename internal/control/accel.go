package control

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/template"
)

// ErrAccelUnsupported: an operation GPU sandboxes do not support (pause,
// snapshot, clone — physical devices cannot be checkpointed).
var ErrAccelUnsupported = errors.New("not supported for sandboxes with accelerators")

// accelRequest is the scheduling stage: the request merged with the
// template's contract, checked against the capacity the node reports. It
// fails fast: *accel.CompatError when no device could ever match,
// accel.ErrNoCapacity when all matching ones are in use.
func (m *Manager) accelRequest(ctx context.Context, o CreateOptions, tpl template.Template) ([]accel.Request, error) {
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
	info, err := m.nodeInfo(ctx)
	if err != nil {
		return nil, err
	}
	if info.Accelerators == nil {
		return nil, &accel.CompatError{Stage: accel.StageScheduling, Layer: accel.LayerHardware,
			Detail: fmt.Sprintf("no node has accelerators (requested %d %s)", eff.Count, eff.Class)}
	}
	if err := m.node.FitAccelerators(ctx, eff, tpl.Accelerators); err != nil {
		if derr := m.node.DenyAccelerators(ctx, "", err); derr != nil {
			m.log.Error("recording an accelerator denial", "err", derr)
		}
		return nil, err
	}
	return []accel.Request{eff}, nil
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
