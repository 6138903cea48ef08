package control

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/accel"
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
