package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

const volumeCols = `id, team_id, name, driver, state, token, private_data, size_mb, created_at, updated_at`

func scanVolume(r scanner) (*store.Volume, error) {
	var v store.Volume
	var state string
	var created, updated int64
	if err := r.Scan(&v.ID, &v.TeamID, &v.Name, &v.Driver, &state, &v.Token, &v.PrivateData, &v.SizeMB, &created, &updated); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	v.State = store.VolumeState(state)
	v.CreatedAt, v.UpdatedAt = fromTS(created), fromTS(updated)
	return &v, nil
}

// CreateVolume inserts a volume row, checking the team's volume quota in
// the same transaction.
func (s *Store) CreateVolume(ctx context.Context, v *store.Volume) error {
	return retry(ctx, s.d, func() error { return s.createVolumeTx(ctx, v) })
}

func (s *Store) createVolumeTx(ctx context.Context, v *store.Volume) error {
	now := time.Now().UTC()
	if v.CreatedAt.IsZero() {
		v.CreatedAt = now
	}
	v.UpdatedAt = now
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if v.TeamID != store.SystemTeamID {
		t, err := scanTeam(tx.QueryRowContext(ctx, `SELECT `+teamCols+` FROM teams WHERE id=?`, v.TeamID))
		if errors.Is(err, store.ErrNotFound) {
			return fmt.Errorf("%w: team %s does not exist", store.ErrNotFound, v.TeamID)
		}
		if err != nil {
			return err
		}
		if max := t.Quota.MaxVolumes; max > 0 {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM volumes WHERE team_id=?`, v.TeamID).Scan(&n); err != nil {
				return err
			}
			if n+1 > max {
				return &store.QuotaError{Quota: "volumes", Limit: max}
			}
		}
		if max := t.Quota.MaxVolumeMB; max > 0 && v.SizeMB > 0 {
			var n int
			if err := tx.QueryRowContext(ctx, `SELECT COALESCE(SUM(size_mb), 0) FROM volumes WHERE team_id=?`, v.TeamID).Scan(&n); err != nil {
				return err
			}
			if n+v.SizeMB > max {
				return &store.QuotaError{Quota: "volume MiB", Limit: max}
			}
		}
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO volumes(`+volumeCols+`) VALUES(?,?,?,?,?,?,?,?,?,?)`,
		v.ID, v.TeamID, v.Name, v.Driver, string(v.State), v.Token, v.PrivateData, v.SizeMB, ts(v.CreatedAt), ts(v.UpdatedAt))
	if s.d.IsConstraint(err) {
		return fmt.Errorf("%w: volume %s already exists", store.ErrConflict, v.Name)
	}
	if err != nil {
		return err
	}
	return tx.Commit()
}

// GetVolume returns ErrNotFound for unknown IDs.
func (s *Store) GetVolume(ctx context.Context, id string) (*store.Volume, error) {
	return scanVolume(s.db.QueryRowContext(ctx, `SELECT `+volumeCols+` FROM volumes WHERE id=?`, id))
}

// VolumeByName returns ErrNotFound unless teamID has a volume called name.
func (s *Store) VolumeByName(ctx context.Context, teamID, name string) (*store.Volume, error) {
	return scanVolume(s.db.QueryRowContext(ctx, `SELECT `+volumeCols+` FROM volumes WHERE team_id=? AND name=?`, teamID, name))
}

// ListVolumes returns every volume, oldest first.
func (s *Store) ListVolumes(ctx context.Context) ([]*store.Volume, error) {
	return s.listVolumes(ctx, `SELECT `+volumeCols+` FROM volumes ORDER BY created_at, id`)
}

// ListTeamVolumes returns teamID's volumes, oldest first.
func (s *Store) ListTeamVolumes(ctx context.Context, teamID string) ([]*store.Volume, error) {
	return s.listVolumes(ctx, `SELECT `+volumeCols+` FROM volumes WHERE team_id=? ORDER BY created_at, id`, teamID)
}

func (s *Store) listVolumes(ctx context.Context, q string, args ...any) ([]*store.Volume, error) {
	return queryAll(ctx, s.db, scanVolume, q, args...)
}

// UpdateVolume overwrites all fields.
func (s *Store) UpdateVolume(ctx context.Context, v *store.Volume) error {
	v.UpdatedAt = time.Now().UTC()
	res, err := s.db.ExecContext(ctx, `UPDATE volumes SET name=?, driver=?, state=?, token=?, private_data=?, size_mb=?, updated_at=? WHERE id=?`,
		v.Name, v.Driver, string(v.State), v.Token, v.PrivateData, v.SizeMB, ts(v.UpdatedAt), v.ID)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// MarkVolumeDeleting is the delete guard (see store.Store).
func (s *Store) MarkVolumeDeleting(ctx context.Context, id string) (*store.Volume, error) {
	return retry1(ctx, s.d, func() (*store.Volume, error) { return s.markVolumeDeletingTx(ctx, id) })
}

func (s *Store) markVolumeDeletingTx(ctx context.Context, id string) (*store.Volume, error) {
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	v, err := scanVolume(tx.QueryRowContext(ctx, `SELECT `+volumeCols+` FROM volumes WHERE id=?`, id))
	if err != nil {
		return nil, err
	}
	var refs int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM volume_attachments WHERE volume_id=?`, id).Scan(&refs); err != nil {
		return nil, err
	}
	if refs > 0 {
		return v, fmt.Errorf("%w: volume %s is mounted by %d sandbox(es)", store.ErrConflict, id, refs)
	}
	if v.State != store.VolumeReady && v.State != store.VolumeDeleting {
		return v, fmt.Errorf("%w: volume %s is %s", store.ErrConflict, id, v.State)
	}
	v.State = store.VolumeDeleting
	v.UpdatedAt = time.Now().UTC()
	if _, err := tx.ExecContext(ctx, `UPDATE volumes SET state=?, updated_at=? WHERE id=?`, string(v.State), ts(v.UpdatedAt), id); err != nil {
		return nil, err
	}
	return v, tx.Commit()
}

// DeleteVolume removes the row unless attachments still reference it.
func (s *Store) DeleteVolume(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM volumes WHERE id=? AND NOT EXISTS (SELECT 1 FROM volume_attachments WHERE volume_id=?)`, id, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		if _, err := s.GetVolume(ctx, id); err != nil {
			return err
		}
		return fmt.Errorf("%w: volume %s is still referenced", store.ErrConflict, id)
	}
	return nil
}

// ListVolumeAttachments filters by volume and/or sandbox.
func (s *Store) ListVolumeAttachments(ctx context.Context, volumeID, sandboxID string) ([]*store.VolumeAttachment, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT volume_id, sandbox_id, node, path, read_only, created_at FROM volume_attachments
WHERE (`+s.d.typed("text")+`='' OR volume_id=?) AND (`+s.d.typed("text")+`='' OR sandbox_id=?) ORDER BY created_at, volume_id, sandbox_id`, volumeID, volumeID, sandboxID, sandboxID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []*store.VolumeAttachment
	for rows.Next() {
		var a store.VolumeAttachment
		var created int64
		if err := rows.Scan(&a.VolumeID, &a.SandboxID, &a.Node, &a.Path, &a.ReadOnly, &created); err != nil {
			return nil, err
		}
		a.CreatedAt = fromTS(created)
		out = append(out, &a)
	}
	return out, rows.Err()
}

// MoveVolumeAttachments implements store.Store.
func (s *Store) MoveVolumeAttachments(ctx context.Context, sandboxID, node string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE volume_attachments SET node=? WHERE sandbox_id=?`, node, sandboxID)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// DeleteVolumeAttachments drops a sandbox's references.
func (s *Store) DeleteVolumeAttachments(ctx context.Context, sandboxID string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM volume_attachments WHERE sandbox_id=?`, sandboxID)
	return err
}
