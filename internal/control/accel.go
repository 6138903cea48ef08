package control

import (
	"encoding/json"
	"errors"

	"github.com/cubicle-dev/cubicle/internal/accel"
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
