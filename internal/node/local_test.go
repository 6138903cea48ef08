package node_test

import (
	"context"
	goruntime "runtime"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/node/nodetest/localnode"
	"github.com/cubicle-dev/cubicle/internal/runtime"
)

func TestMain(m *testing.M) { localnode.Main(m) }

// Local passes the node conformance suite with runc.
func TestLocalConformance(t *testing.T) {
	localnode.Conformance(t, func(_ *testing.T, l *node.Local) node.Node { return l })
}

// holdingDriver holds every Create until release is closed, counting the
// creates inside the runtime at once.
type holdingDriver struct {
	runtime.Driver
	release     chan struct{}
	mu          sync.Mutex
	in, maxSeen int
}

func (h *holdingDriver) Create(ctx context.Context, spec runtime.Spec) (runtime.Info, error) {
	h.mu.Lock()
	h.in++
	h.maxSeen = max(h.maxSeen, h.in)
	h.mu.Unlock()
	<-h.release
	defer func() {
		h.mu.Lock()
		h.in--
		h.mu.Unlock()
	}()
	return h.Driver.Create(ctx, spec)
}

// A node boots at most MaxConcurrentBoots sandboxes at once (default its
// CPUs, at least 2); the others wait their turn and then boot.
func TestLocalBootsAFewAtATime(t *testing.T) {
	h := &holdingDriver{release: make(chan struct{})}
	l, _ := localnode.NewWithRuntime(t, func(d runtime.Driver) runtime.Driver {
		h.Driver = d
		return h
	})
	limit := max(2, goruntime.NumCPU())
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n := limit + 2
	errc := make(chan error, n)
	ids := make([]string, n)
	for i := range n {
		ids[i] = "boots" + localnode.RandHex(t, 6)
		go func() {
			_, err := l.Create(ctx, node.CreateRequest{ID: ids[i], Layers: localnode.Layers(t), EnvdToken: "tok", CPUCount: 1, MemoryMB: 256})
			errc <- err
		}()
	}
	t.Cleanup(func() {
		for _, id := range ids {
			l.Delete(context.Background(), id)
		}
	})
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		h.mu.Lock()
		in := h.in
		h.mu.Unlock()
		if in == limit {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d creates reached the runtime, want %d", in, limit)
		}
	}
	close(h.release)
	for range n {
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	}
	if h.maxSeen != limit {
		t.Fatalf("%d creates in the runtime at once, want at most %d", h.maxSeen, limit)
	}
}
