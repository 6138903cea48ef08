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

const secretCols = `id, team_id, name, version, metadata, sealed, created_at, updated_at`

func scanSecret(r scanner) (*store.Secret, error) {
	var s store.Secret
	var meta string
	var created, updated int64
	if err := r.Scan(&s.ID, &s.TeamID, &s.Name, &s.Version, &meta, &s.Sealed, &created, &updated); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	if err := json.Unmarshal([]byte(meta), &s.Metadata); err != nil {
		return nil, fmt.Errorf("secret %s metadata: %w", s.ID, err)
	}
	s.Metadata = orEmpty(s.Metadata)
	s.CreatedAt, s.UpdatedAt = fromTS(created), fromTS(updated)
	return &s, nil
}

// CreateSecret implements store.SecretStore.
func (s *Store) CreateSecret(ctx context.Context, sec *store.Secret, limit int) error {
	return retry(ctx, s.d, func() error { return s.createSecretTx(ctx, sec, limit) })
}

func (s *Store) createSecretTx(ctx context.Context, sec *store.Secret, limit int) error {
	if sec.CreatedAt.IsZero() {
		sec.CreatedAt = time.Now().UTC()
	}
	sec.UpdatedAt = sec.CreatedAt
	sec.Metadata = orEmpty(sec.Metadata)
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if sec.TeamID != store.SystemTeamID {
		if _, err := scanTeam(tx.QueryRowContext(ctx, `SELECT `+teamCols+` FROM teams WHERE id=?`, sec.TeamID)); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("%w: team %s does not exist", store.ErrNotFound, sec.TeamID)
			}
			return err
		}
	}
	if limit > 0 {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM secrets WHERE team_id=?`, sec.TeamID).Scan(&n); err != nil {
			return err
		}
		if n >= limit {
			return &store.QuotaError{Quota: "secrets", Limit: limit}
		}
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO secrets(`+secretCols+`) VALUES(?,?,?,?,?,?,?,?)`,
		sec.ID, sec.TeamID, sec.Name, sec.Version, js(sec.Metadata), sec.Sealed, ts(sec.CreatedAt), ts(sec.UpdatedAt))
	if s.d.IsConstraint(err) {
		return fmt.Errorf("%w: secret %q already exists", store.ErrConflict, sec.Name)
	}
	if err != nil {
		return err
	}
	return tx.Commit()
}

// GetSecret implements store.SecretStore.
func (s *Store) GetSecret(ctx context.Context, teamID, id string) (*store.Secret, error) {
	return scanSecret(s.db.QueryRowContext(ctx, `SELECT `+secretCols+` FROM secrets WHERE team_id=? AND id=?`, teamID, id))
}

// SecretByName implements store.SecretStore.
func (s *Store) SecretByName(ctx context.Context, teamID, name string) (*store.Secret, error) {
	return scanSecret(s.db.QueryRowContext(ctx, `SELECT `+secretCols+` FROM secrets WHERE team_id=? AND name=?`, teamID, name))
}

// ListSecrets implements store.SecretStore.
func (s *Store) ListSecrets(ctx context.Context, f store.SecretFilter) ([]*store.Secret, error) {
	limit := f.Limit
	if limit <= 0 {
		limit = s.d.NoLimit
	}
	after := ts(f.AfterCreated)
	return queryAll(ctx, s.db, scanSecret, `SELECT `+secretCols+` FROM secrets WHERE team_id=?
 AND (created_at > ? OR (created_at = ? AND id > ?)) ORDER BY created_at, id LIMIT ?`,
		f.TeamID, after, after, f.AfterID, limit)
}

// UpdateSecret implements store.SecretStore: a compare-and-set on version.
func (s *Store) UpdateSecret(ctx context.Context, teamID, id string, fromVersion int, sealed []byte, metadata map[string]string) (*store.Secret, error) {
	return retry1(ctx, s.d, func() (*store.Secret, error) { return s.updateSecretTx(ctx, teamID, id, fromVersion, sealed, metadata) })
}

func (s *Store) updateSecretTx(ctx context.Context, teamID, id string, fromVersion int, sealed []byte, metadata map[string]string) (*store.Secret, error) {
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	cur, err := scanSecret(tx.QueryRowContext(ctx, `SELECT `+secretCols+` FROM secrets WHERE team_id=? AND id=?`, teamID, id))
	if err != nil {
		return nil, err
	}
	if cur.Version != fromVersion {
		return nil, fmt.Errorf("%w: secret %s is at version %d, not %d", store.ErrConflict, id, cur.Version, fromVersion)
	}
	if metadata != nil {
		cur.Metadata = metadata
	}
	cur.Version, cur.Sealed, cur.UpdatedAt = fromVersion+1, sealed, time.Now().UTC()
	res, err := tx.ExecContext(ctx, `UPDATE secrets SET version=?, metadata=?, sealed=?, updated_at=? WHERE team_id=? AND id=? AND version=?`,
		cur.Version, js(cur.Metadata), cur.Sealed, ts(cur.UpdatedAt), teamID, id, fromVersion)
	if err != nil {
		return nil, err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return nil, fmt.Errorf("%w: secret %s changed concurrently", store.ErrConflict, id)
	}
	return cur, tx.Commit()
}

// DeleteSecret implements store.SecretStore.
func (s *Store) DeleteSecret(ctx context.Context, teamID, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM secrets WHERE team_id=? AND id=?`, teamID, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}
