package store

import (
	"context"
	"time"
)

// PolicyScope is what a placement policy applies to.
type PolicyScope string

const (
	// PolicyTeam applies to every sandbox a team creates.
	PolicyTeam PolicyScope = "team"
	// PolicyTemplate applies to every sandbox of a template, whoever
	// creates it.
	PolicyTemplate PolicyScope = "template"
)

// Valid reports whether s is a known scope.
func (s PolicyScope) Valid() bool { return s == PolicyTeam || s == PolicyTemplate }

// PlacementPolicy is a team's or a template's scheduler extension: CEL
// source text, at most one policy per (Scope, Target). The store keeps
// the text only; whoever writes a row has compiled and cost-checked it
// (control.ValidatePlacementPolicy), and whoever reads it compiles it.
type PlacementPolicy struct {
	Scope  PolicyScope
	Target string // the team ID or the template ID
	// Filter (bool) and Score (int or double) are CEL expressions; at
	// least one is set.
	Filter    string
	Score     string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// PolicyStore holds placement policies.
type PolicyStore interface {
	// PutPlacementPolicy inserts the policy of (p.Scope, p.Target) or
	// replaces its expressions, keeping CreatedAt; it sets p's times.
	PutPlacementPolicy(ctx context.Context, p *PlacementPolicy) error
	// GetPlacementPolicy returns one policy; ErrNotFound when none.
	GetPlacementPolicy(ctx context.Context, scope PolicyScope, target string) (*PlacementPolicy, error)
	// ListPlacementPolicies returns every policy ordered by scope, target.
	ListPlacementPolicies(ctx context.Context) ([]*PlacementPolicy, error)
	// DeletePlacementPolicy removes one policy; ErrNotFound when none.
	DeletePlacementPolicy(ctx context.Context, scope PolicyScope, target string) error
	// PlacementPoliciesFor returns the policies that apply to a create
	// by teamID from templateID, in one read: the team's first, then the
	// template's (each absent when not set).
	PlacementPoliciesFor(ctx context.Context, teamID, templateID string) ([]*PlacementPolicy, error)
}
