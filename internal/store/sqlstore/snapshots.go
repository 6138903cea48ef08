package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

const snapshotCols = `id, team_id, sandbox_id, source_template_id, node, kind, runtime, layers, checkpoint, size_bytes, volumes, env_vars, default_user, agent_token, internal, created_at, deleted_at, image, snapshot_layers, package`

// layerSep joins Snapshot.Layers: overlayfs' lowerdir separator, which no
// layer path holds.
const layerSep = ":"

// CreateSnapshot implements store.SnapshotStore.
func (s *Store) CreateSnapshot(ctx context.Context, sn *store.Snapshot, t *store.Template, b *store.TemplateBuild, limit int) error {
	return retry(ctx, s.d, func() error { return s.createSnapshotTx(ctx, sn, t, b, limit) })
}

func (s *Store) createSnapshotTx(ctx context.Context, sn *store.Snapshot, t *store.Template, b *store.TemplateBuild, limit int) error {
	now := time.Now().UTC()
	sn.CreatedAt = now
	if sn.Internal {
		sn.DeletedAt = now
	}
	t.CreatedAt, t.UpdatedAt = now, now
	b.CreatedAt, b.UpdatedAt, b.FinishedAt = now, now, now
	vols, err := json.Marshal(emptyMounts(sn.Volumes))
	if err != nil {
		return err
	}
	env, err := json.Marshal(sn.EnvVars)
	if err != nil {
		return err
	}
	pkg, err := json.Marshal(sn.Package)
	if err != nil {
		return err
	}
	if sn.Package == nil {
		pkg = []byte("[]")
	}
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if limit > 0 && !sn.Internal {
		var n int
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM snapshots WHERE team_id=? AND deleted_at=0`, sn.TeamID).Scan(&n); err != nil {
			return err
		}
		if n >= limit {
			return &store.QuotaError{Quota: "snapshots per team", Limit: limit}
		}
	}
	if err := insertTemplate(ctx, tx, t, b); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO snapshots(`+snapshotCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		sn.ID, sn.TeamID, sn.SandboxID, sn.SourceTemplateID, sn.Node, sn.Kind, sn.Runtime, strings.Join(sn.Layers, layerSep),
		sn.Checkpoint, sn.SizeBytes, string(vols), string(env), sn.DefaultUser, sn.AgentToken, sn.Internal, ts(sn.CreatedAt), ts(sn.DeletedAt),
		sn.Image, strings.Join(sn.SnapshotLayers, layerSep), string(pkg)); err != nil {
		if s.d.IsConstraint(err) {
			return fmt.Errorf("%w: snapshot %s exists", store.ErrConflict, sn.ID)
		}
		return err
	}
	return tx.Commit()
}

func emptyMounts(v []store.VolumeMount) []store.VolumeMount {
	if v == nil {
		return []store.VolumeMount{}
	}
	return v
}

func scanSnapshot(row scanner) (*store.Snapshot, error) {
	var sn store.Snapshot
	var layers, snapLayers, vols, env, pkg string
	var created, deleted int64
	if err := row.Scan(&sn.ID, &sn.TeamID, &sn.SandboxID, &sn.SourceTemplateID, &sn.Node, &sn.Kind, &sn.Runtime, &layers,
		&sn.Checkpoint, &sn.SizeBytes, &vols, &env, &sn.DefaultUser, &sn.AgentToken, &sn.Internal, &created, &deleted, &sn.Image, &snapLayers, &pkg); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	if layers != "" {
		sn.Layers = strings.Split(layers, layerSep)
	}
	if snapLayers != "" {
		sn.SnapshotLayers = strings.Split(snapLayers, layerSep)
	}
	if err := json.Unmarshal([]byte(vols), &sn.Volumes); err != nil {
		return nil, fmt.Errorf("snapshot %s volumes: %w", sn.ID, err)
	}
	if err := json.Unmarshal([]byte(env), &sn.EnvVars); err != nil {
		return nil, fmt.Errorf("snapshot %s env: %w", sn.ID, err)
	}
	if err := json.Unmarshal([]byte(pkg), &sn.Package); err != nil {
		return nil, fmt.Errorf("snapshot %s package: %w", sn.ID, err)
	}
	if len(sn.Package) == 0 {
		sn.Package = nil
	}
	sn.CreatedAt, sn.DeletedAt = fromTS(created), fromTS(deleted)
	return &sn, nil
}

// GetSnapshot implements store.SnapshotStore.
func (s *Store) GetSnapshot(ctx context.Context, id string) (*store.Snapshot, error) {
	return scanSnapshot(s.db.QueryRowContext(ctx, `SELECT `+snapshotCols+` FROM snapshots WHERE id=?`, id))
}

// ListSnapshots implements store.SnapshotStore: newest first.
func (s *Store) ListSnapshots(ctx context.Context, f store.SnapshotFilter) ([]*store.Snapshot, error) {
	q := `SELECT ` + snapshotCols + ` FROM snapshots WHERE 1=1`
	var args []any
	if f.TeamID != "" {
		q += ` AND team_id=?`
		args = append(args, f.TeamID)
	}
	if f.SandboxID != "" {
		q += ` AND sandbox_id=?`
		args = append(args, f.SandboxID)
	}
	if !f.IncludeDeleted {
		q += ` AND deleted_at=0`
	}
	if f.AfterID != "" {
		q += ` AND (created_at < ? OR (created_at = ? AND id < ?))`
		args = append(args, ts(f.AfterCreated), ts(f.AfterCreated), f.AfterID)
	}
	q += ` ORDER BY created_at DESC, id DESC`
	if f.Limit > 0 {
		q += fmt.Sprintf(` LIMIT %d`, f.Limit)
	}
	return queryAll(ctx, s.db, scanSnapshot, q, args...)
}

// PurgeSnapshot implements store.SnapshotStore.
func (s *Store) PurgeSnapshot(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM snapshots WHERE id=? AND deleted_at<>0`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		if _, err := s.GetSnapshot(ctx, id); err == nil {
			return fmt.Errorf("%w: snapshot %s is not deleted", store.ErrConflict, id)
		}
		return store.ErrNotFound
	}
	return nil
}
