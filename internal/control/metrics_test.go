package control

import (
	"context"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/node"
	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/sqlite"
)

// stuckStatsNode is a fakeNode whose agents never answer a metrics call.
type stuckStatsNode struct {
	*fakeNode
	entered chan struct{}
	once    sync.Once
	release chan struct{}
}

func (n *stuckStatsNode) Stats(context.Context, string, string) (node.Stats, error) {
	n.once.Do(func() { close(n.entered) })
	<-n.release // ignores its context: the worst agent
	return node.Stats{}, nil
}

// A metrics call that never returns must not delay a timeout kill.
func TestSlowMetricsDoNotDelayTimeouts(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := sqlite.Open(filepath.Join(t.TempDir(), "c.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	tpl := &store.Template{ID: "tpl", PrimaryName: "tpl", Names: []string{"tpl"}, ReadyBuildID: "b1", LatestBuildID: "b1", BuildStatus: store.BuildReady}
	if err := st.CreateTemplate(ctx, tpl, &store.TemplateBuild{ID: "b1", TemplateID: "tpl", Status: store.BuildReady, Rootfs: "/x"}); err != nil {
		t.Fatal(err)
	}
	n := &stuckStatsNode{fakeNode: newFakeNode(), entered: make(chan struct{}), release: make(chan struct{})}
	defer close(n.release)
	m := New(Config{}, st, n, storeResolver{st})
	m.sampleEvery = 10 * time.Millisecond
	sb, err := m.Create(ctx, CreateOptions{TemplateID: "tpl", Timeout: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	go m.Run(ctx)
	select {
	case <-n.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("sampler never asked for metrics")
	}
	if err := m.SetTimeout(ctx, sb.ID, 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * reapInterval)
	for time.Now().Before(deadline) {
		if row, err := st.GetSandbox(ctx, sb.ID); err == nil && row.State == store.StateKilled {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("sandbox not killed within %v of its timeout while a metrics call hung", 3*reapInterval)
}
