package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

const policyCols = `scope, target, filter_expr, score_expr, created_at, updated_at`

func scanPolicy(r scanner) (*store.PlacementPolicy, error) {
	var p store.PlacementPolicy
	var scope string
	var created, updated int64
	if err := r.Scan(&scope, &p.Target, &p.Filter, &p.Score, &created, &updated); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	p.Scope = store.PolicyScope(scope)
	p.CreatedAt, p.UpdatedAt = fromTS(created), fromTS(updated)
	return &p, nil
}

// PutPlacementPolicy implements store.PolicyStore: one upsert, so two
// writers of the same policy leave one row, the last writer's.
func (s *Store) PutPlacementPolicy(ctx context.Context, p *store.PlacementPolicy) error {
	if !p.Scope.Valid() {
		return fmt.Errorf("placement policy scope %q: want %q or %q", p.Scope, store.PolicyTeam, store.PolicyTemplate)
	}
	now := time.Now().UTC()
	var created int64
	err := s.db.QueryRowContext(ctx, `INSERT INTO placement_policies(`+policyCols+`) VALUES(?,?,?,?,?,?)
ON CONFLICT(scope, target) DO UPDATE SET filter_expr=excluded.filter_expr, score_expr=excluded.score_expr, updated_at=excluded.updated_at
RETURNING created_at`, string(p.Scope), p.Target, p.Filter, p.Score, ts(now), ts(now)).Scan(&created)
	if err != nil {
		return err
	}
	p.CreatedAt, p.UpdatedAt = fromTS(created), fromTS(ts(now))
	return nil
}

// GetPlacementPolicy implements store.PolicyStore.
func (s *Store) GetPlacementPolicy(ctx context.Context, scope store.PolicyScope, target string) (*store.PlacementPolicy, error) {
	p, err := scanPolicy(s.db.QueryRowContext(ctx, `SELECT `+policyCols+` FROM placement_policies WHERE scope=? AND target=?`, string(scope), target))
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: no placement policy for %s %s", store.ErrNotFound, scope, target)
	}
	return p, err
}

// ListPlacementPolicies implements store.PolicyStore.
func (s *Store) ListPlacementPolicies(ctx context.Context) ([]*store.PlacementPolicy, error) {
	return s.queryPolicies(ctx, `SELECT `+policyCols+` FROM placement_policies ORDER BY scope, target`)
}

// DeletePlacementPolicy implements store.PolicyStore.
func (s *Store) DeletePlacementPolicy(ctx context.Context, scope store.PolicyScope, target string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM placement_policies WHERE scope=? AND target=?`, string(scope), target)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: no placement policy for %s %s", store.ErrNotFound, scope, target)
	}
	return nil
}

// PlacementPoliciesFor implements store.PolicyStore. "team" sorts before
// "template", so ORDER BY scope puts the team's first.
func (s *Store) PlacementPoliciesFor(ctx context.Context, teamID, templateID string) ([]*store.PlacementPolicy, error) {
	return s.queryPolicies(ctx, `SELECT `+policyCols+` FROM placement_policies
WHERE (scope='team' AND target=?) OR (scope='template' AND target=?) ORDER BY scope`, teamID, templateID)
}

func (s *Store) queryPolicies(ctx context.Context, q string, args ...any) ([]*store.PlacementPolicy, error) {
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []*store.PlacementPolicy{}
	for rows.Next() {
		p, err := scanPolicy(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	return out, rows.Err()
}
