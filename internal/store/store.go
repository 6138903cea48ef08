// Package store defines Cubicle's durable state and the interface every
// backend (SQLite embedded, PostgreSQL for clusters) implements.
package store

import (
	"context"
	"errors"
	"time"
)

var (
	ErrNotFound = errors.New("store: not found")
	ErrConflict = errors.New("store: conflict")
)

// SandboxState is the control-plane state of a sandbox.
type SandboxState string

const (
	StateCreating SandboxState = "creating"
	StateRunning  SandboxState = "running"
	StatePausing  SandboxState = "pausing"
	StatePaused   SandboxState = "paused"
	StateResuming SandboxState = "resuming"
	StateKilled   SandboxState = "killed"
)

// Live reports whether the sandbox still holds node resources.
func (s SandboxState) Live() bool { return s != StateKilled }

// Network is the stored network configuration of a sandbox.
type Network struct {
	AllowInternet      bool     `json:"allowInternet"`
	AllowPublicTraffic bool     `json:"allowPublicTraffic"`
	AllowOut           []string `json:"allowOut,omitempty"`
	DenyOut            []string `json:"denyOut,omitempty"`
	MaskRequestHost    string   `json:"maskRequestHost,omitempty"`
}

// Sandbox is one sandbox row.
type Sandbox struct {
	ID           string
	TemplateID   string
	Alias        string
	State        SandboxState
	Node         string
	Metadata     map[string]string
	EnvVars      map[string]string
	EnvdToken    string
	TrafficToken string
	CPUCount     int
	MemoryMB     int
	DiskSizeMB   int
	Network      Network
	AutoPause    bool
	AutoResume   bool
	Addr         string // sandbox IP on the node
	APIKeyID     string
	StartedAt    time.Time
	EndAt        time.Time
	UpdatedAt    time.Time
	KilledAt     time.Time
	KillReason   string
}

// SandboxFilter selects sandboxes in List. Zero values match everything.
type SandboxFilter struct {
	States   []SandboxState
	Metadata map[string]string
	Template string
	// Cursor pagination in StartedAt-desc (or asc) order: rows strictly after
	// (AfterStarted, AfterID).
	AfterStarted time.Time
	AfterID      string
	Ascending    bool
	StartedAfter time.Time
	Limit        int
}

// APIKey is a stored key; only the hash of the secret is kept.
type APIKey struct {
	ID        string
	Name      string
	Hash      string // hex sha256 of the key
	Prefix    string // first chars, for display
	CreatedAt time.Time
	LastUsed  time.Time
}

// Event is an audit/lifecycle event.
type Event struct {
	ID        int64
	SandboxID string
	Type      string
	Level     string
	Message   string
	Time      time.Time
}

// Store is the persistence boundary. Implementations must be safe for concurrent use.
type Store interface {
	CreateSandbox(ctx context.Context, s *Sandbox) error
	GetSandbox(ctx context.Context, id string) (*Sandbox, error)
	// UpdateSandbox writes every field of s. ErrNotFound if missing.
	UpdateSandbox(ctx context.Context, s *Sandbox) error
	// CompareAndSetState moves a sandbox from one of `from` to `to` atomically;
	// ErrConflict when the current state is not in from.
	CompareAndSetState(ctx context.Context, id string, from []SandboxState, to SandboxState) (*Sandbox, error)
	ListSandboxes(ctx context.Context, f SandboxFilter) ([]*Sandbox, error)
	CountSandboxes(ctx context.Context, states []SandboxState) (int, error)

	CreateAPIKey(ctx context.Context, k *APIKey) error
	APIKeyByHash(ctx context.Context, hash string) (*APIKey, error)
	ListAPIKeys(ctx context.Context) ([]*APIKey, error)
	DeleteAPIKey(ctx context.Context, id string) error
	TouchAPIKey(ctx context.Context, id string, t time.Time) error

	AppendEvent(ctx context.Context, e *Event) error
	ListEvents(ctx context.Context, sandboxID string, since time.Time, limit int) ([]*Event, error)

	Close() error
}
