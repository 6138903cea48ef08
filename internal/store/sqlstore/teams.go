package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

const teamCols = `id, name, max_sandboxes, max_vcpus, max_memory_mb, max_disk_mb, max_volumes, max_volume_mb, created_at`

func scanTeam(r scanner) (*store.Team, error) {
	var t store.Team
	var created int64
	q := &t.Quota
	if err := r.Scan(&t.ID, &t.Name, &q.MaxSandboxes, &q.MaxVCPUs, &q.MaxMemoryMB, &q.MaxDiskMB, &q.MaxVolumes, &q.MaxVolumeMB, &created); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	t.CreatedAt = fromTS(created)
	return &t, nil
}

// CreateTeam inserts a team row.
func (s *Store) CreateTeam(ctx context.Context, t *store.Team) error {
	if t.ID == store.SystemTeamID || t.Name == "" {
		return fmt.Errorf("%w: a team needs an ID and a name", store.ErrConflict)
	}
	if t.CreatedAt.IsZero() {
		t.CreatedAt = time.Now().UTC()
	}
	q := t.Quota
	_, err := s.db.ExecContext(ctx, `INSERT INTO teams(`+teamCols+`) VALUES(?,?,?,?,?,?,?,?,?)`,
		t.ID, t.Name, q.MaxSandboxes, q.MaxVCPUs, q.MaxMemoryMB, q.MaxDiskMB, q.MaxVolumes, q.MaxVolumeMB, ts(t.CreatedAt))
	if s.d.IsConstraint(err) {
		return fmt.Errorf("%w: team %s exists", store.ErrConflict, t.Name)
	}
	return err
}

// GetTeam returns ErrNotFound for unknown IDs.
func (s *Store) GetTeam(ctx context.Context, id string) (*store.Team, error) {
	return scanTeam(s.db.QueryRowContext(ctx, `SELECT `+teamCols+` FROM teams WHERE id=?`, id))
}

// TeamByName returns ErrNotFound for unknown names.
func (s *Store) TeamByName(ctx context.Context, name string) (*store.Team, error) {
	return scanTeam(s.db.QueryRowContext(ctx, `SELECT `+teamCols+` FROM teams WHERE name=?`, name))
}

// ListTeams returns every team, oldest first.
func (s *Store) ListTeams(ctx context.Context) ([]*store.Team, error) {
	return queryAll(ctx, s.db, scanTeam, `SELECT `+teamCols+` FROM teams ORDER BY created_at, id`)
}

// UpdateTeam writes the name and quota.
func (s *Store) UpdateTeam(ctx context.Context, t *store.Team) error {
	q := t.Quota
	res, err := s.db.ExecContext(ctx, `UPDATE teams SET name=?, max_sandboxes=?, max_vcpus=?, max_memory_mb=?, max_disk_mb=?, max_volumes=?, max_volume_mb=? WHERE id=?`,
		t.Name, q.MaxSandboxes, q.MaxVCPUs, q.MaxMemoryMB, q.MaxDiskMB, q.MaxVolumes, q.MaxVolumeMB, t.ID)
	if s.d.IsConstraint(err) {
		return fmt.Errorf("%w: team %s exists", store.ErrConflict, t.Name)
	}
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// DeleteTeam removes a team that owns nothing, in one transaction so no
// key or object can be added to it meanwhile.
func (s *Store) DeleteTeam(ctx context.Context, id string) error {
	return retry(ctx, s.d, func() error { return s.deleteTeamTx(ctx, id) })
}

func (s *Store) deleteTeamTx(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := scanTeam(tx.QueryRowContext(ctx, `SELECT `+teamCols+` FROM teams WHERE id=?`, id)); err != nil {
		return err
	}
	for _, c := range []struct{ what, q string }{
		{"API keys", `SELECT COUNT(*) FROM api_keys WHERE team_id=?`},
		{"live sandboxes", `SELECT COUNT(*) FROM sandboxes WHERE team_id=? AND state != '` + string(store.StateKilled) + `'`},
		{"volumes", `SELECT COUNT(*) FROM volumes WHERE team_id=?`},
		{"templates", `SELECT COUNT(*) FROM templates WHERE team_id=?`},
		{"secrets", `SELECT COUNT(*) FROM secrets WHERE team_id=?`},
	} {
		var n int
		if err := tx.QueryRowContext(ctx, c.q, id).Scan(&n); err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%w: team %s still has %d %s", store.ErrConflict, id, n, c.what)
		}
	}
	// A team's placement policy goes with it: a later team can never
	// inherit it.
	if _, err := tx.ExecContext(ctx, `DELETE FROM placement_policies WHERE scope='team' AND target=?`, id); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM teams WHERE id=?`, id); err != nil {
		return err
	}
	return tx.Commit()
}
