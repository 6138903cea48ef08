package control

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
	"github.com/cubicle-dev/cubicle/internal/scheduler"
)

// A GPU sandbox cannot pause, so autoPause would turn into a silent kill at
// timeout: create refuses it with a 400 (ErrInvalid) naming autoPause, and
// nothing is created.
func TestCreateRefusesAutoPauseWithAccelerators(t *testing.T) {
	ctx := context.Background()
	m, n, _ := newPoolManager(t)
	_, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", AutoPause: true, Timeout: time.Minute,
		Accelerators: []accel.Request{{Class: "gpu", Count: 1}}})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "autoPause") {
		t.Fatalf("create GPU sandbox with autoPause: %v, want ErrInvalid naming autoPause", err)
	}
	if n.count() != 0 {
		t.Fatalf("%d sandboxes on the node", n.count())
	}
	// Without devices autoPause is fine.
	if _, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", AutoPause: true, Timeout: time.Minute}); err != nil {
		t.Fatal(err)
	}
}

// Placement goes through the scheduler, and a node without accelerators
// still refuses a GPU request as a single node does: an accel.CompatError
// naming the hardware layer at scheduling (the API's 400), not the
// scheduler's no-fit summary, and nothing is created.
func TestCreatePlacesThroughSchedulerWithSingleNodeErrors(t *testing.T) {
	ctx := context.Background()
	m, n, _ := newPoolManager(t)
	_, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Minute, Accelerators: []accel.Request{{Class: "gpu", Count: 1}}})
	var ce *accel.CompatError
	if !errors.As(err, &ce) || ce.Layer != accel.LayerHardware || ce.Stage != accel.StageScheduling || errors.Is(err, scheduler.ErrNoFit) {
		t.Fatalf("GPU request on a node without accelerators: %v, want the node's hardware-layer CompatError", err)
	}
	if n.count() != 0 {
		t.Fatalf("%d sandboxes on the node", n.count())
	}
	sb, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if sb.Node != "local" {
		t.Fatalf("placed on %q, want the in-process node", sb.Node)
	}
}
