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

// RedeemJoinToken implements store.ClusterStore. The conditional UPDATE
// and the reservation of the node ID are one serializable transaction
// (SQLite: one writer; PostgreSQL: SERIALIZABLE, retried on conflict), so
// two tokens redeemed for one node ID at once cannot both win.
func (s *Store) RedeemJoinToken(ctx context.Context, id, secretHash, nodeID string, now time.Time) (*store.JoinToken, error) {
	return retry1(ctx, s.d, func() (*store.JoinToken, error) { return s.redeemTx(ctx, id, secretHash, nodeID, now) })
}

func (s *Store) redeemTx(ctx context.Context, id, secretHash, nodeID string, now time.Time) (*store.JoinToken, error) {
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	t, err := scanJoinToken(tx.QueryRowContext(ctx, `UPDATE join_tokens SET used_at=?, used_by=?
WHERE id=? AND secret_hash=? AND used_at=0 AND expires_at>?
AND NOT EXISTS (SELECT 1 FROM nodes WHERE id=?)
AND NOT EXISTS (SELECT 1 FROM node_identities WHERE node_id=? AND joined=?) RETURNING `+joinTokenCols,
		ts(now), nodeID, id, secretHash, ts(now), nodeID, nodeID, true))
	if errors.Is(err, store.ErrNotFound) {
		// Refused: read the row only to say why.
		return nil, redeemRefusal(ctx, tx, id, secretHash, nodeID, now)
	}
	if err != nil {
		return nil, err
	}
	var revoked int64
	if err := tx.QueryRowContext(ctx, `INSERT INTO node_identities(node_id, joined, revoked_at) VALUES(?,?,0)
ON CONFLICT(node_id) DO UPDATE SET joined=excluded.joined RETURNING revoked_at`, nodeID, true).Scan(&revoked); err != nil {
		return nil, err
	}
	t.NodeRevokedAt = fromTS(revoked)
	return t, tx.Commit()
}

func redeemRefusal(ctx context.Context, tx *txn, id, secretHash, nodeID string, now time.Time) error {
	t, err := scanJoinToken(tx.QueryRowContext(ctx, `SELECT `+joinTokenCols+` FROM join_tokens WHERE id=?`, id))
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.ErrTokenUnknown
	case err != nil:
		return err
	case t.SecretHash != secretHash:
		return store.ErrTokenUnknown
	case !t.UsedAt.IsZero():
		return store.ErrTokenUsed
	case !now.Before(t.ExpiresAt):
		return store.ErrTokenExpired
	default:
		return fmt.Errorf("%w: %s", store.ErrNodeExists, nodeID)
	}
}

// NodeJoined implements store.ClusterStore.
func (s *Store) NodeJoined(ctx context.Context, id string) (bool, error) {
	var joined bool
	err := s.db.QueryRowContext(ctx, `SELECT joined FROM node_identities WHERE node_id=?`, id).Scan(&joined)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return joined, err
}

// NodeRevokedAt implements store.ClusterStore.
func (s *Store) NodeRevokedAt(ctx context.Context, id string) (time.Time, error) {
	var revoked int64
	err := s.db.QueryRowContext(ctx, `SELECT revoked_at FROM node_identities WHERE node_id=?`, id).Scan(&revoked)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, err
	}
	return fromTS(revoked), nil
}
