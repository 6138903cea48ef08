package sqlite

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
	"github.com/cubicle-dev/cubicle/internal/store/storetest"
)

func TestConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store {
		s, err := Open(filepath.Join(t.TempDir(), "c.db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return s
	})
}

// State must survive closing and reopening the file (a serve restart).
func TestReopenKeepsState(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	sb := &store.Sandbox{ID: "reopenreopenreopen00", TemplateID: "base", State: store.StatePaused, StartedAt: time.Now(), EndAt: time.Now()}
	if err := s.CreateSandbox(context.Background(), sb); err != nil {
		t.Fatal(err)
	}
	s.Close()
	s2, err := Open(path) // migrations must be idempotent
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	got, err := s2.GetSandbox(context.Background(), sb.ID)
	if err != nil || got.State != store.StatePaused {
		t.Fatalf("after reopen: %+v %v", got, err)
	}
}
