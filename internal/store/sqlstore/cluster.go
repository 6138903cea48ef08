package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

// InitClusterCA implements store.ClusterStore. The row's fixed key makes
// the insert a no-op for every replica but the first.
func (s *Store) InitClusterCA(ctx context.Context, ca *store.ClusterCA) (*store.ClusterCA, error) {
	if ca.CreatedAt.IsZero() {
		ca.CreatedAt = time.Now().UTC()
	}
	if _, err := s.db.ExecContext(ctx, `INSERT INTO cluster_ca(id, cert_pem, key_sealed, created_at) VALUES(1,?,?,?) ON CONFLICT(id) DO NOTHING`,
		ca.CertPEM, ca.KeySealed, ts(ca.CreatedAt)); err != nil {
		return nil, err
	}
	return s.ClusterCA(ctx)
}

// ClusterCA implements store.ClusterStore.
func (s *Store) ClusterCA(ctx context.Context) (*store.ClusterCA, error) {
	var ca store.ClusterCA
	var created int64
	err := s.db.QueryRowContext(ctx, `SELECT cert_pem, key_sealed, created_at FROM cluster_ca WHERE id=1`).Scan(&ca.CertPEM, &ca.KeySealed, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("%w: no cluster CA yet", store.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	ca.CreatedAt = fromTS(created)
	return &ca, nil
}

const joinTokenCols = `id, secret_hash, labels, created_at, expires_at, used_at, used_by`

func scanJoinToken(r scanner) (*store.JoinToken, error) {
	var t store.JoinToken
	var labels string
	var created, expires, used int64
	if err := r.Scan(&t.ID, &t.SecretHash, &labels, &created, &expires, &used, &t.UsedBy); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	if err := json.Unmarshal([]byte(labels), &t.Labels); err != nil {
		return nil, fmt.Errorf("join token %s labels: %w", t.ID, err)
	}
	t.Labels = orEmpty(t.Labels)
	t.CreatedAt, t.ExpiresAt, t.UsedAt = fromTS(created), fromTS(expires), fromTS(used)
	return &t, nil
}

// CreateJoinToken implements store.ClusterStore.
func (s *Store) CreateJoinToken(ctx context.Context, t *store.JoinToken) error {
	if t.CreatedAt.IsZero() {
		t.CreatedAt = time.Now().UTC()
	}
	t.Labels = orEmpty(t.Labels)
	_, err := s.db.ExecContext(ctx, `INSERT INTO join_tokens(`+joinTokenCols+`) VALUES(?,?,?,?,?,?,?)`,
		t.ID, t.SecretHash, js(t.Labels), ts(t.CreatedAt), ts(t.ExpiresAt), ts(t.UsedAt), t.UsedBy)
	if s.d.IsConstraint(err) {
		return fmt.Errorf("%w: join token %s already exists", store.ErrConflict, t.ID)
	}
	return err
}

// ListJoinTokens implements store.ClusterStore.
func (s *Store) ListJoinTokens(ctx context.Context) ([]*store.JoinToken, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+joinTokenCols+` FROM join_tokens ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*store.JoinToken
	for rows.Next() {
		t, err := scanJoinToken(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// DeleteJoinToken implements store.ClusterStore.
func (s *Store) DeleteJoinToken(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM join_tokens WHERE id=?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: join token %s", store.ErrNotFound, id)
	}
	return nil
}

// RedeemJoinToken implements store.ClusterStore: one conditional UPDATE,
// so the check and the mark are a single atomic statement.
func (s *Store) RedeemJoinToken(ctx context.Context, id, secretHash, nodeID string, now time.Time) (*store.JoinToken, error) {
	t, err := scanJoinToken(s.db.QueryRowContext(ctx, `UPDATE join_tokens SET used_at=?, used_by=?
WHERE id=? AND secret_hash=? AND used_at=0 AND expires_at>? AND NOT EXISTS (SELECT 1 FROM nodes WHERE id=?) RETURNING `+joinTokenCols,
		ts(now), nodeID, id, secretHash, ts(now), nodeID))
	if !errors.Is(err, store.ErrNotFound) {
		return t, err
	}
	// Refused: read the row only to say why.
	t, err = scanJoinToken(s.db.QueryRowContext(ctx, `SELECT `+joinTokenCols+` FROM join_tokens WHERE id=?`, id))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return nil, store.ErrTokenUnknown
	case err != nil:
		return nil, err
	case t.SecretHash != secretHash:
		return nil, store.ErrTokenUnknown
	case !t.UsedAt.IsZero():
		return nil, store.ErrTokenUsed
	case !now.Before(t.ExpiresAt):
		return nil, store.ErrTokenExpired
	default:
		return nil, fmt.Errorf("%w: %s", store.ErrNodeExists, nodeID)
	}
}
