package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

var _ store.TemplateStore = (*Store)(nil)

const templateCols = `id, team_id, primary_name, public, cpu_count, memory_mb, disk_size_mb, start_cmd, ready_cmd, run_as, workdir,
ready_build_id, ready_image, latest_build_id, build_status, build_count, spawn_count, last_spawned_at, pool_size, created_at, updated_at, accelerators`

func scanTemplate(r scanner) (*store.Template, error) {
	var t store.Template
	var spawned, created, updated int64
	if err := r.Scan(&t.ID, &t.TeamID, &t.PrimaryName, &t.Public, &t.CPUCount, &t.MemoryMB, &t.DiskSizeMB, &t.StartCmd, &t.ReadyCmd, &t.RunAs, &t.Workdir,
		&t.ReadyBuildID, &t.ReadyImage, &t.LatestBuildID, &t.BuildStatus, &t.BuildCount, &t.SpawnCount, &spawned, &t.PoolSize, &created, &updated, &t.Accelerators); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	t.LastSpawnedAt, t.CreatedAt, t.UpdatedAt = fromTS(spawned), fromTS(created), fromTS(updated)
	return &t, nil
}

func templateArgs(t *store.Template) []any {
	return []any{t.ID, t.TeamID, t.PrimaryName, t.Public, t.CPUCount, t.MemoryMB, t.DiskSizeMB, t.StartCmd, t.ReadyCmd, t.RunAs, t.Workdir,
		t.ReadyBuildID, t.ReadyImage, t.LatestBuildID, t.BuildStatus, t.BuildCount, t.SpawnCount, ts(t.LastSpawnedAt), t.PoolSize, ts(t.CreatedAt), ts(t.UpdatedAt), t.Accelerators}
}

const buildCols = `id, template_id, status, cpu_count, memory_mb, disk_size_mb, image, rootfs, reason, step, spec, created_at, updated_at, finished_at, image_digest`

func scanBuild(r scanner) (*store.TemplateBuild, error) {
	var b store.TemplateBuild
	var created, updated, finished int64
	if err := r.Scan(&b.ID, &b.TemplateID, &b.Status, &b.CPUCount, &b.MemoryMB, &b.DiskSizeMB, &b.Image, &b.Rootfs, &b.Reason, &b.Step, &b.Spec, &created, &updated, &finished, &b.ImageDigest); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	b.CreatedAt, b.UpdatedAt, b.FinishedAt = fromTS(created), fromTS(updated), fromTS(finished)
	return &b, nil
}

func buildArgs(b *store.TemplateBuild) []any {
	return []any{b.ID, b.TemplateID, b.Status, b.CPUCount, b.MemoryMB, b.DiskSizeMB, b.Image, b.Rootfs, b.Reason, b.Step, b.Spec, ts(b.CreatedAt), ts(b.UpdatedAt), ts(b.FinishedAt), b.ImageDigest}
}

// insertNames registers names in the template's team (looked up in tx).
func insertNames(ctx context.Context, tx *txn, id string, names []string) error {
	var team string
	if err := tx.QueryRowContext(ctx, `SELECT team_id FROM templates WHERE id=?`, id).Scan(&team); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return store.ErrNotFound
		}
		return err
	}
	for _, n := range names {
		if _, err := tx.ExecContext(ctx, `INSERT INTO template_names(team_id, name, template_id) VALUES(?,?,?)`, team, n, id); err != nil {
			if tx.d.IsConstraint(err) {
				return fmt.Errorf("%w: template name %q is taken", store.ErrConflict, n)
			}
			return err
		}
	}
	return nil
}

// CreateTemplate inserts template, names and first build atomically.
func (s *Store) CreateTemplate(ctx context.Context, t *store.Template, b *store.TemplateBuild) error {
	return retry(ctx, s.d, func() error { return s.createTemplateTx(ctx, t, b) })
}

func (s *Store) createTemplateTx(ctx context.Context, t *store.Template, b *store.TemplateBuild) error {
	now := time.Now().UTC()
	t.CreatedAt, t.UpdatedAt = now, now
	b.CreatedAt, b.UpdatedAt = now, now
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := insertTemplate(ctx, tx, t, b); err != nil {
		return err
	}
	return tx.Commit()
}

// insertTemplate writes a template row, its names and its first build.
func insertTemplate(ctx context.Context, tx *txn, t *store.Template, b *store.TemplateBuild) error {
	if _, err := tx.ExecContext(ctx, `INSERT INTO templates(`+templateCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`, templateArgs(t)...); err != nil {
		if tx.d.IsConstraint(err) {
			return fmt.Errorf("%w: template %s (%s) exists", store.ErrConflict, t.ID, t.PrimaryName)
		}
		return err
	}
	if err := insertNames(ctx, tx, t.ID, t.Names); err != nil {
		return err
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO template_builds(`+buildCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`, buildArgs(b)...)
	return err
}

func (s *Store) loadNames(ctx context.Context, t *store.Template) error {
	rows, err := s.db.QueryContext(ctx, `SELECT name FROM template_names WHERE template_id=? ORDER BY name`, t.ID)
	if err != nil {
		return err
	}
	defer rows.Close()
	t.Names = []string{}
	if t.PrimaryName != "" {
		// A template made by CubeAPI's create-from-image has no name
		// until an alias is given to it.
		t.Names = append(t.Names, t.PrimaryName)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			return err
		}
		if n != t.PrimaryName {
			t.Names = append(t.Names, n)
		}
	}
	return rows.Err()
}

// GetTemplate returns ErrNotFound for unknown IDs.
func (s *Store) GetTemplate(ctx context.Context, id string) (*store.Template, error) {
	t, err := scanTemplate(s.db.QueryRowContext(ctx, `SELECT `+templateCols+` FROM templates WHERE id=?`, id))
	if err != nil {
		return nil, err
	}
	return t, s.loadNames(ctx, t)
}

// TemplateByName resolves a name as teamID sees it: its own first, then
// the oldest public template registering it.
func (s *Store) TemplateByName(ctx context.Context, teamID, name string) (*store.Template, error) {
	var id string
	if err := s.db.QueryRowContext(ctx, `SELECT n.template_id FROM template_names n JOIN templates t ON t.id = n.template_id
WHERE n.name = ? AND (n.team_id = ? OR t.public) ORDER BY (n.team_id = ?) DESC, t.created_at, t.id LIMIT 1`, name, teamID, teamID).Scan(&id); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	return s.GetTemplate(ctx, id)
}

// ListTemplates pages by (created_at, id).
func (s *Store) ListTemplates(ctx context.Context, afterID string, limit int) ([]*store.Template, error) {
	return s.listTemplates(ctx, "", nil, afterID, limit)
}

// ListTeamTemplates pages teamID's own and the public templates.
func (s *Store) ListTeamTemplates(ctx context.Context, teamID, afterID string, limit int) ([]*store.Template, error) {
	return s.listTemplates(ctx, `(team_id = ? OR public)`, []any{teamID}, afterID, limit)
}

func (s *Store) listTemplates(ctx context.Context, cond string, args []any, afterID string, limit int) ([]*store.Template, error) {
	q := `SELECT ` + templateCols + ` FROM templates`
	var where []string
	if cond != "" {
		where = append(where, cond)
	}
	if afterID != "" {
		where = append(where, `(created_at, id) > (SELECT created_at, id FROM templates WHERE id=?)`)
		args = append(args, afterID)
	}
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY created_at, id`
	if limit > 0 {
		q += fmt.Sprintf(` LIMIT %d`, limit)
	}
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	var out []*store.Template
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, t)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, t := range out {
		if err := s.loadNames(ctx, t); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// templateSettings is the UPDATE every whole-template write shares: all
// columns but the ID, team, creation time and the counters, which only
// change by atomic increments.
const templateSettings = `UPDATE templates SET primary_name=?, public=?, cpu_count=?, memory_mb=?, disk_size_mb=?, start_cmd=?, ready_cmd=?, run_as=?, workdir=?,
ready_build_id=?, ready_image=?, latest_build_id=?, build_status=?, pool_size=?, updated_at=?, accelerators=?`

func templateSettingsArgs(t *store.Template) []any {
	return []any{t.PrimaryName, t.Public, t.CPUCount, t.MemoryMB, t.DiskSizeMB, t.StartCmd, t.ReadyCmd, t.RunAs, t.Workdir,
		t.ReadyBuildID, t.ReadyImage, t.LatestBuildID, t.BuildStatus, t.PoolSize, ts(t.UpdatedAt), t.Accelerators}
}

// UpdateTemplate writes the settings; the counters are left alone.
func (s *Store) UpdateTemplate(ctx context.Context, t *store.Template) error {
	t.UpdatedAt = time.Now().UTC()
	res, err := s.db.ExecContext(ctx, templateSettings+` WHERE id=?`, append(templateSettingsArgs(t), t.ID)...)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// AddTemplateBuild inserts b and updates t in one transaction, guarded by
// the previous latest build (two concurrent rebuilds: one wins).
func (s *Store) AddTemplateBuild(ctx context.Context, t *store.Template, b *store.TemplateBuild, prevLatestID string) error {
	return retry(ctx, s.d, func() error { return s.addTemplateBuildTx(ctx, t, b, prevLatestID) })
}

func (s *Store) addTemplateBuildTx(ctx context.Context, t *store.Template, b *store.TemplateBuild, prevLatestID string) error {
	now := time.Now().UTC()
	b.CreatedAt, b.UpdatedAt = now, now
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	t.UpdatedAt = now
	res, err := tx.ExecContext(ctx, templateSettings+`, build_count=build_count+1 WHERE id=? AND latest_build_id=?
AND NOT EXISTS (SELECT 1 FROM template_builds WHERE id=? AND (status IN (?,?) OR (status=? AND spec<>'')))`,
		append(templateSettingsArgs(t), t.ID, prevLatestID, prevLatestID, store.BuildBuilding, store.BuildUploaded, store.BuildWaiting)...)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		var latest string
		if err := tx.QueryRowContext(ctx, `SELECT latest_build_id FROM templates WHERE id=?`, t.ID).Scan(&latest); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return store.ErrNotFound
			}
			return err
		}
		if latest != prevLatestID {
			return fmt.Errorf("%w: template %s has a newer build (%s)", store.ErrConflict, t.ID, latest)
		}
		return fmt.Errorf("%w: template %s is building or has a queued build (%s)", store.ErrConflict, t.ID, latest)
	}
	// The previous build, when it was never started, is superseded here,
	// in the same transaction (StartTemplateBuild then finds it taken).
	if _, err := tx.ExecContext(ctx, `UPDATE template_builds SET status=?, reason=?, updated_at=?, finished_at=? WHERE id=? AND status=? AND spec=''`,
		store.BuildError, "superseded by build "+b.ID, ts(now), ts(now), prevLatestID, store.BuildWaiting); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO template_builds(`+buildCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`, buildArgs(b)...); err != nil {
		return err
	}
	if err := tx.QueryRowContext(ctx, `SELECT build_count FROM templates WHERE id=?`, t.ID).Scan(&t.BuildCount); err != nil {
		return err
	}
	return tx.Commit()
}

// StartTemplateBuild stores the spec of a waiting, unstarted build.
func (s *Store) StartTemplateBuild(ctx context.Context, buildID, spec string) error {
	res, err := s.db.ExecContext(ctx, `UPDATE template_builds SET spec=?, updated_at=? WHERE id=? AND status=? AND spec=''`,
		spec, ts(time.Now().UTC()), buildID, store.BuildWaiting)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		var status string
		if err := s.db.QueryRowContext(ctx, `SELECT status FROM template_builds WHERE id=?`, buildID).Scan(&status); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return store.ErrNotFound
			}
			return err
		}
		return fmt.Errorf("%w: build %s is %s or already started", store.ErrConflict, buildID, status)
	}
	return nil
}

// RecordTemplateBuild writes b and the template columns its outcome owns.
func (s *Store) RecordTemplateBuild(ctx context.Context, b *store.TemplateBuild, ready *store.TemplateReady) error {
	return retry(ctx, s.d, func() error { return s.recordTemplateBuildTx(ctx, b, ready) })
}

func (s *Store) recordTemplateBuildTx(ctx context.Context, b *store.TemplateBuild, ready *store.TemplateReady) error {
	now := time.Now().UTC()
	b.UpdatedAt = now
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `UPDATE template_builds SET status=?, cpu_count=?, memory_mb=?, disk_size_mb=?, image=?, image_digest=?, rootfs=?, reason=?, step=?, spec=?, updated_at=?, finished_at=? WHERE id=?`,
		b.Status, b.CPUCount, b.MemoryMB, b.DiskSizeMB, b.Image, b.ImageDigest, b.Rootfs, b.Reason, b.Step, b.Spec, ts(b.UpdatedAt), ts(b.FinishedAt), b.ID)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	if _, err := tx.ExecContext(ctx, `UPDATE templates SET build_status=?, updated_at=? WHERE id=? AND latest_build_id=?`, b.Status, ts(now), b.TemplateID, b.ID); err != nil {
		return err
	}
	if ready != nil {
		if _, err := tx.ExecContext(ctx, `UPDATE templates SET ready_build_id=?, ready_image=?, start_cmd=?, ready_cmd=?, run_as=?, workdir=?, cpu_count=?, memory_mb=?, disk_size_mb=?, updated_at=? WHERE id=?`,
			b.ID, ready.Image, ready.StartCmd, ready.ReadyCmd, ready.RunAs, ready.Workdir, ready.CPUCount, ready.MemoryMB, ready.DiskSizeMB, ts(now), b.TemplateID); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// DeleteTemplate removes the template with its names, builds, logs and tags.
func (s *Store) DeleteTemplate(ctx context.Context, id string) error {
	return retry(ctx, s.d, func() error { return s.deleteTemplateTx(ctx, id) })
}

func (s *Store) deleteTemplateTx(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `DELETE FROM templates WHERE id=?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	if _, err := tx.ExecContext(ctx, `UPDATE snapshots SET deleted_at=? WHERE id=? AND deleted_at=0`, ts(time.Now()), id); err != nil {
		return err
	}
	return tx.Commit()
}

// SetTemplateNames replaces the template's names (the primary name stays).
func (s *Store) SetTemplateNames(ctx context.Context, id string, names []string) error {
	return retry(ctx, s.d, func() error { return s.setTemplateNamesTx(ctx, id, names) })
}

func (s *Store) setTemplateNamesTx(ctx context.Context, id string, names []string) error {
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `DELETE FROM template_names WHERE template_id=?`, id); err != nil {
		return err
	}
	if err := insertNames(ctx, tx, id, names); err != nil {
		return err
	}
	return tx.Commit()
}

// SetTemplateAlias implements store.TemplateStore.
func (s *Store) SetTemplateAlias(ctx context.Context, id, alias string, newerOnly bool) (bool, error) {
	var took bool
	err := retry(ctx, s.d, func() error {
		var err error
		took, err = s.setTemplateAliasTx(ctx, id, alias, newerOnly)
		return err
	})
	return took, err
}

func (s *Store) setTemplateAliasTx(ctx context.Context, id, alias string, newerOnly bool) (bool, error) {
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return false, err
	}
	defer tx.Rollback()
	var team string
	var created int64
	if err := tx.QueryRowContext(ctx, `SELECT team_id, created_at FROM templates WHERE id=?`, id).Scan(&team, &created); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return false, store.ErrNotFound
		}
		return false, err
	}
	if alias != "" {
		var holder string
		var holderCreated int64
		err := tx.QueryRowContext(ctx, `SELECT n.template_id, t.created_at FROM template_names n JOIN templates t ON t.id = n.template_id
WHERE n.team_id = ? AND n.name = ?`, team, alias).Scan(&holder, &holderCreated)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return false, err
		case holder != id:
			if newerOnly && (holderCreated > created || (holderCreated == created && holder > id)) {
				return false, nil
			}
			// The alias and its tagged forms leave the holder together.
			// substr, not LIKE: names may hold '_', a LIKE wildcard.
			if _, err := tx.ExecContext(ctx, `DELETE FROM template_names WHERE template_id=? AND (name=? OR substr(name, 1, ?)=?)`,
				holder, alias, len(alias)+1, alias+":"); err != nil {
				return false, err
			}
			if _, err := tx.ExecContext(ctx, `UPDATE templates SET primary_name='', updated_at=? WHERE id=? AND primary_name=?`,
				ts(time.Now().UTC()), holder, alias); err != nil {
				return false, err
			}
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM template_names WHERE template_id=?`, id); err != nil {
		return false, err
	}
	if alias != "" {
		names := []string{alias}
		rows, err := tx.QueryContext(ctx, `SELECT tag FROM template_tags WHERE template_id=? ORDER BY tag`, id)
		if err != nil {
			return false, err
		}
		for rows.Next() {
			var tag string
			if err := rows.Scan(&tag); err != nil {
				rows.Close()
				return false, err
			}
			if tag != "default" {
				names = append(names, alias+":"+tag)
			}
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return false, err
		}
		if err := insertNames(ctx, tx, id, names); err != nil {
			return false, err
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE templates SET primary_name=?, updated_at=? WHERE id=?`, alias, ts(time.Now().UTC()), id); err != nil {
		return false, err
	}
	return true, tx.Commit()
}

// GetTemplateBuild returns ErrNotFound for unknown builds.
func (s *Store) GetTemplateBuild(ctx context.Context, id string) (*store.TemplateBuild, error) {
	return scanBuild(s.db.QueryRowContext(ctx, `SELECT `+buildCols+` FROM template_builds WHERE id=?`, id))
}

// ListTemplateBuilds returns a template's builds, newest first.
func (s *Store) ListTemplateBuilds(ctx context.Context, templateID string) ([]*store.TemplateBuild, error) {
	return queryAll(ctx, s.db, scanBuild, `SELECT `+buildCols+` FROM template_builds WHERE template_id=? ORDER BY created_at DESC, id DESC`, templateID)
}

// TouchTemplateBuild implements store.Store.
func (s *Store) TouchTemplateBuild(ctx context.Context, id string) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE template_builds SET updated_at=? WHERE id=? AND status IN (?, ?)`,
		ts(time.Now().UTC()), id, store.BuildBuilding, store.BuildUploaded); err != nil {
		return err
	}
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM template_builds WHERE id=?`, id).Scan(&n); err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// UpdateTemplateBuild writes every mutable column.
func (s *Store) UpdateTemplateBuild(ctx context.Context, b *store.TemplateBuild) error {
	b.UpdatedAt = time.Now().UTC()
	res, err := s.db.ExecContext(ctx, `UPDATE template_builds SET status=?, cpu_count=?, memory_mb=?, disk_size_mb=?, image=?, image_digest=?, rootfs=?, reason=?, step=?, spec=?, updated_at=?, finished_at=? WHERE id=?`,
		b.Status, b.CPUCount, b.MemoryMB, b.DiskSizeMB, b.Image, b.ImageDigest, b.Rootfs, b.Reason, b.Step, b.Spec, ts(b.UpdatedAt), ts(b.FinishedAt), b.ID)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// AppendBuildLogs numbers entries after the build's last one.
func (s *Store) AppendBuildLogs(ctx context.Context, buildID string, logs []store.BuildLog) error {
	return retry(ctx, s.d, func() error { return s.appendBuildLogsTx(ctx, buildID, logs) })
}

func (s *Store) appendBuildLogsTx(ctx context.Context, buildID string, logs []store.BuildLog) error {
	if len(logs) == 0 {
		return nil
	}
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var next int
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq)+1, 0) FROM template_build_logs WHERE build_id=?`, buildID).Scan(&next); err != nil {
		return err
	}
	for _, l := range logs {
		if l.Time.IsZero() {
			l.Time = time.Now().UTC()
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO template_build_logs(build_id, seq, time, level, message, step) VALUES(?,?,?,?,?,?)`,
			buildID, next, ts(l.Time), l.Level, l.Message, l.Step); err != nil {
			return err
		}
		next++
	}
	return tx.Commit()
}

// ListBuildLogs returns entries with seq >= offset, at most limit.
func (s *Store) ListBuildLogs(ctx context.Context, buildID string, offset, limit int) ([]store.BuildLog, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, err := s.db.QueryContext(ctx, `SELECT seq, time, level, message, step FROM template_build_logs WHERE build_id=? AND seq>=? ORDER BY seq LIMIT ?`, buildID, offset, limit)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.BuildLog
	for rows.Next() {
		var l store.BuildLog
		var t int64
		if err := rows.Scan(&l.Seq, &t, &l.Level, &l.Message, &l.Step); err != nil {
			return nil, err
		}
		l.Time = fromTS(t)
		out = append(out, l)
	}
	return out, rows.Err()
}

// SetTemplateTag points tag at buildID (insert or move).
func (s *Store) SetTemplateTag(ctx context.Context, templateID, tag, buildID string) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO template_tags(template_id, tag, build_id, created_at) VALUES(?,?,?,?)
ON CONFLICT(template_id, tag) DO UPDATE SET build_id=excluded.build_id, created_at=excluded.created_at`, templateID, tag, buildID, ts(time.Now()))
	return err
}

// DeleteTemplateTag removes a tag; ErrNotFound when absent.
func (s *Store) DeleteTemplateTag(ctx context.Context, templateID, tag string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM template_tags WHERE template_id=? AND tag=?`, templateID, tag)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// ListTemplateTags returns the template's tags by name.
func (s *Store) ListTemplateTags(ctx context.Context, templateID string) ([]store.TemplateTag, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT tag, build_id, created_at FROM template_tags WHERE template_id=? ORDER BY tag`, templateID)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []store.TemplateTag
	for rows.Next() {
		var tg store.TemplateTag
		var c int64
		if err := rows.Scan(&tg.Tag, &tg.BuildID, &c); err != nil {
			return nil, err
		}
		tg.CreatedAt = fromTS(c)
		out = append(out, tg)
	}
	return out, rows.Err()
}

// RecordSpawn bumps the spawn counter atomically.
func (s *Store) RecordSpawn(ctx context.Context, id string, at time.Time) error {
	_, err := s.db.ExecContext(ctx, `UPDATE templates SET spawn_count=spawn_count+1, last_spawned_at=? WHERE id=?`, ts(at), id)
	return err
}

// PutIdempotency keeps the first response stored under a key.
func (s *Store) PutIdempotency(ctx context.Context, k *store.Idempotency) (*store.Idempotency, error) {
	if k.CreatedAt.IsZero() {
		k.CreatedAt = time.Now().UTC()
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO idempotency_keys(key, body_hash, response, created_at) VALUES(?,?,?,?)`, k.Key, k.BodyHash, k.Response, ts(k.CreatedAt))
	if err == nil {
		return k, nil
	}
	if !s.d.IsConstraint(err) {
		return nil, err
	}
	var got store.Idempotency
	var c int64
	if err := s.db.QueryRowContext(ctx, `SELECT key, body_hash, response, created_at FROM idempotency_keys WHERE key=?`, k.Key).Scan(&got.Key, &got.BodyHash, &got.Response, &c); err != nil {
		return nil, err
	}
	got.CreatedAt = fromTS(c)
	return &got, nil
}

// DeleteIdempotencyBefore drops keys older than t (the collector).
func (s *Store) DeleteIdempotencyBefore(ctx context.Context, t time.Time) (int, error) {
	res, err := s.db.ExecContext(ctx, `DELETE FROM idempotency_keys WHERE created_at < ?`, ts(t))
	if err != nil {
		return 0, err
	}
	n, _ := res.RowsAffected()
	return int(n), nil
}

// SetIdempotencyResponse fills in the response once the request finished.
func (s *Store) SetIdempotencyResponse(ctx context.Context, key, response string) error {
	_, err := s.db.ExecContext(ctx, `UPDATE idempotency_keys SET response=? WHERE key=?`, response, key)
	return err
}
