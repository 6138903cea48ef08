package control

import (
	"context"

	"github.com/cubicle-dev/cubicle/internal/store"
)

type teamKey struct{}

// WithTeam scopes the sandbox lookups made with ctx to one team: Get, and
// so every user-facing operation on a sandbox ID, treats another team's
// sandbox exactly like a missing one. The API sets it for every
// authenticated request; the control plane's own loops run without it.
// It survives context.WithoutCancel, so work detached from a request stays
// scoped.
func WithTeam(ctx context.Context, teamID string) context.Context {
	return context.WithValue(ctx, teamKey{}, teamID)
}

// teamSees reports whether ctx may see sb (always, without WithTeam).
func teamSees(ctx context.Context, sb *store.Sandbox) bool {
	team, ok := ctx.Value(teamKey{}).(string)
	return !ok || sb.TeamID == team
}

// teamOf is the team ctx is scoped to (ok=false without WithTeam).
func teamOf(ctx context.Context) (string, bool) {
	team, ok := ctx.Value(teamKey{}).(string)
	return team, ok
}

// teamSeesID is teamSees for an object owned by teamID.
func teamSeesID(ctx context.Context, teamID string) bool {
	team, ok := teamOf(ctx)
	return !ok || team == teamID
}
