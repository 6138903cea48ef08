package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/cubicle-dev/cubicle/internal/store"
)

func ts(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

func fromTS(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n).UTC()
}

func js(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

const sandboxCols = `id, team_id, template_id, alias, state, node, metadata, env_vars, envd_token, traffic_token,
cpu_count, memory_mb, disk_size_mb, network, auto_pause, auto_resume, addr, api_key_id,
started_at, end_at, updated_at, killed_at, kill_reason, volumes, default_user, accelerators, layers, pause_memory, image, snapshot_layers, pause_package`

func sandboxArgs(sb *store.Sandbox) []any {
	return []any{sb.ID, sb.TeamID, sb.TemplateID, sb.Alias, string(sb.State), sb.Node, js(orEmpty(sb.Metadata)), js(orEmpty(sb.EnvVars)),
		sb.EnvdToken, sb.TrafficToken, sb.CPUCount, sb.MemoryMB, sb.DiskSizeMB, js(sb.Network),
		sb.AutoPause, sb.AutoResume, sb.Addr, sb.APIKeyID, ts(sb.StartedAt), ts(sb.EndAt), ts(sb.UpdatedAt),
		ts(sb.KilledAt), sb.KillReason, js(mountsOrEmpty(sb.Volumes)), sb.DefaultUser, sb.Accelerators, strings.Join(sb.Layers, layerSep), sb.PauseMemory,
		sb.Image, strings.Join(sb.SnapshotLayers, layerSep), pausePackage(sb.PausePackage)}
}

// pausePackage is the pause_package column: JSON, or "" for none.
func pausePackage(p *store.PausePackage) string {
	if p == nil {
		return ""
	}
	return js(p)
}

func mountsOrEmpty(m []store.VolumeMount) []store.VolumeMount {
	if m == nil {
		return []store.VolumeMount{}
	}
	return m
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

type scanner interface{ Scan(...any) error }

// queryAll runs q and scans every row with scan.
func queryAll[T any](ctx context.Context, db querier, scan func(scanner) (T, error), q string, args ...any) ([]T, error) {
	rows, err := db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []T
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

func scanSandbox(r scanner) (*store.Sandbox, error) {
	var sb store.Sandbox
	var state, meta, envs, network, vols, layers, snapLayers, pausePkg string
	var started, end, updated, killed int64
	if err := r.Scan(&sb.ID, &sb.TeamID, &sb.TemplateID, &sb.Alias, &state, &sb.Node, &meta, &envs, &sb.EnvdToken, &sb.TrafficToken,
		&sb.CPUCount, &sb.MemoryMB, &sb.DiskSizeMB, &network, &sb.AutoPause, &sb.AutoResume, &sb.Addr, &sb.APIKeyID,
		&started, &end, &updated, &killed, &sb.KillReason, &vols, &sb.DefaultUser, &sb.Accelerators, &layers, &sb.PauseMemory, &sb.Image, &snapLayers, &pausePkg); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	sb.State = store.SandboxState(state)
	if err := json.Unmarshal([]byte(meta), &sb.Metadata); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(envs), &sb.EnvVars); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(network), &sb.Network); err != nil {
		return nil, err
	}
	if err := json.Unmarshal([]byte(vols), &sb.Volumes); err != nil {
		return nil, err
	}
	if len(sb.Volumes) == 0 {
		sb.Volumes = nil
	}
	if layers != "" {
		sb.Layers = strings.Split(layers, layerSep)
	}
	if snapLayers != "" {
		sb.SnapshotLayers = strings.Split(snapLayers, layerSep)
	}
	if pausePkg != "" {
		sb.PausePackage = &store.PausePackage{}
		if err := json.Unmarshal([]byte(pausePkg), sb.PausePackage); err != nil {
			return nil, err
		}
	}
	sb.StartedAt, sb.EndAt, sb.UpdatedAt, sb.KilledAt = fromTS(started), fromTS(end), fromTS(updated), fromTS(killed)
	return &sb, nil
}

// CreateSandbox inserts a new row and its volume attachment rows in one
// transaction; ErrConflict if the ID exists or a volume is not ready.
func (s *Store) CreateSandbox(ctx context.Context, sb *store.Sandbox) error {
	return retry(ctx, s.d, func() error { return s.createSandboxTx(ctx, sb) })
}

func (s *Store) createSandboxTx(ctx context.Context, sb *store.Sandbox) error {
	if sb.UpdatedAt.IsZero() {
		sb.UpdatedAt = time.Now()
	}
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := checkSandboxQuota(ctx, tx, sb.TeamID, sb); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `INSERT INTO sandboxes(`+sandboxCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`, sandboxArgs(sb)...)
	if s.d.IsConstraint(err) {
		return fmt.Errorf("%w: sandbox %s exists", store.ErrConflict, sb.ID)
	}
	if err != nil {
		return err
	}
	for _, vm := range sb.Volumes {
		// Guarded insert: only a ready volume can gain a reference, which
		// closes the race with MarkVolumeDeleting.
		res, err := tx.ExecContext(ctx, `INSERT INTO volume_attachments(volume_id, sandbox_id, node, path, read_only, created_at)
SELECT `+s.typedList("text", "text", "text", "text", "boolean", "bigint")+` WHERE EXISTS (SELECT 1 FROM volumes WHERE id=? AND state=?)`,
			vm.VolumeID, sb.ID, sb.Node, vm.Path, vm.ReadOnly, ts(sb.UpdatedAt), vm.VolumeID, string(store.VolumeReady))
		if s.d.IsConstraint(err) {
			return fmt.Errorf("%w: volume %s is mounted twice", store.ErrConflict, vm.VolumeID)
		}
		if err != nil {
			return err
		}
		if n, _ := res.RowsAffected(); n == 0 {
			return fmt.Errorf("%w: volume %s does not exist or is not ready", store.ErrConflict, vm.VolumeID)
		}
	}
	return tx.Commit()
}

// GetSandbox returns ErrNotFound for unknown IDs.
func (s *Store) GetSandbox(ctx context.Context, id string) (*store.Sandbox, error) {
	return scanSandbox(s.db.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE id=?`, id))
}

// UpdateSandbox overwrites all fields.
func (s *Store) UpdateSandbox(ctx context.Context, sb *store.Sandbox) error {
	sb.UpdatedAt = time.Now()
	args := sandboxArgs(sb)
	res, err := s.db.ExecContext(ctx, `UPDATE sandboxes SET team_id=?, template_id=?, alias=?, state=?, node=?, metadata=?, env_vars=?, envd_token=?, traffic_token=?,
cpu_count=?, memory_mb=?, disk_size_mb=?, network=?, auto_pause=?, auto_resume=?, addr=?, api_key_id=?,
started_at=?, end_at=?, updated_at=?, killed_at=?, kill_reason=?, volumes=?, default_user=?, accelerators=?, layers=?, pause_memory=?, image=?, snapshot_layers=?, pause_package=? WHERE id=?`, append(args[1:], sb.ID)...)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// CompareAndSetState is an atomic state transition: one UPDATE outside a
// transaction (PostgreSQL runs it at READ COMMITTED, where it re-checks the
// state after waiting for a concurrent writer).
func (s *Store) CompareAndSetState(ctx context.Context, id string, from []store.SandboxState, to store.SandboxState) (*store.Sandbox, error) {
	q := `UPDATE sandboxes SET state=?, updated_at=? WHERE id=?`
	args := []any{string(to), time.Now().UnixNano(), id}
	if len(from) > 0 {
		q += ` AND state IN (` + strings.TrimSuffix(strings.Repeat("?,", len(from)), ",") + `)`
		for _, f := range from {
			args = append(args, string(f))
		}
	}
	// RETURNING gives the row as this update left it; a later writer
	// cannot slip in between.
	sb, err := scanSandbox(s.db.QueryRowContext(ctx, q+` RETURNING `+sandboxCols, args...))
	if !errors.Is(err, store.ErrNotFound) {
		return sb, err
	}
	if sb, err = s.GetSandbox(ctx, id); err != nil {
		return nil, err
	}
	return sb, fmt.Errorf("%w: sandbox %s is %s", store.ErrConflict, id, sb.State)
}

// ListSandboxes applies the filter in SQL so pagination stays correct.
func (s *Store) ListSandboxes(ctx context.Context, f store.SandboxFilter) ([]*store.Sandbox, error) {
	var where []string
	var args []any
	if f.TeamID != "" {
		where = append(where, `team_id = ?`)
		args = append(args, f.TeamID)
	}
	if len(f.States) > 0 {
		where = append(where, `state IN (`+strings.TrimSuffix(strings.Repeat("?,", len(f.States)), ",")+`)`)
		for _, st := range f.States {
			args = append(args, string(st))
		}
	}
	keys := make([]string, 0, len(f.Metadata))
	for k := range f.Metadata {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		where = append(where, s.d.MetadataHas)
		args = append(args, k, f.Metadata[k])
	}
	if f.ExcludeMetadataKey != "" {
		where = append(where, s.d.MetadataHasNot)
		args = append(args, f.ExcludeMetadataKey)
	}
	if f.Template != "" {
		where = append(where, `(template_id = ? OR alias = ?)`)
		args = append(args, f.Template, f.Template)
	}
	if !f.StartedAfter.IsZero() {
		where = append(where, `started_at > ?`)
		args = append(args, ts(f.StartedAfter))
	}
	order := "DESC"
	cmp := "<"
	if f.Ascending {
		order, cmp = "ASC", ">"
	}
	if !f.AfterStarted.IsZero() || f.AfterID != "" {
		where = append(where, `(started_at `+cmp+` ? OR (started_at = ? AND id `+cmp+` ?))`)
		args = append(args, ts(f.AfterStarted), ts(f.AfterStarted), f.AfterID)
	}
	q := `SELECT ` + sandboxCols + ` FROM sandboxes`
	if len(where) > 0 {
		q += ` WHERE ` + strings.Join(where, " AND ")
	}
	q += ` ORDER BY started_at ` + order + `, id ` + order
	if f.Limit > 0 {
		q += fmt.Sprintf(` LIMIT %d`, f.Limit)
	}
	return queryAll(ctx, s.db, scanSandbox, q, args...)
}

// ClaimPoolSandbox picks, checks the claiming team's quota and unmarks in
// one transaction, so the pick and the unmarking cannot interleave with
// another claim or create.
func (s *Store) ClaimPoolSandbox(ctx context.Context, templateID, buildID, teamID string, nodes []string) (*store.Sandbox, error) {
	if nodes != nil && len(nodes) == 0 {
		return nil, fmt.Errorf("%w: no node accepted for a standby of template %s", store.ErrNotFound, templateID)
	}
	return retry1(ctx, s.d, func() (*store.Sandbox, error) { return s.claimPoolSandboxTx(ctx, templateID, buildID, teamID, nodes) })
}

func (s *Store) claimPoolSandboxTx(ctx context.Context, templateID, buildID, teamID string, nodes []string) (*store.Sandbox, error) {
	pk, bk := store.PoolMetadataKey, store.PoolBuildMetadataKey
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback()
	args := []any{string(store.StateRunning), pk, templateID, bk, buildID}
	onNodes := ""
	if nodes != nil {
		onNodes = ` AND node IN (?` + strings.Repeat(`,?`, len(nodes)-1) + `)`
		for _, n := range nodes {
			args = append(args, n)
		}
	}
	sb, err := scanSandbox(tx.QueryRowContext(ctx, `SELECT `+sandboxCols+` FROM sandboxes WHERE state = ? AND `+s.d.MetadataHas+` AND `+s.d.MetadataHas+onNodes+`
ORDER BY started_at ASC, id ASC LIMIT 1`, args...))
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: no standby of template %s on build %s", store.ErrNotFound, templateID, buildID)
	}
	if err != nil {
		return nil, err
	}
	if sb.TeamID != teamID {
		// A standby of a public template changes hands: it now counts
		// against the claiming team.
		if err := checkSandboxQuota(ctx, tx, teamID, sb); err != nil {
			return nil, err
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET metadata = `+s.d.MetadataWithout+`, team_id = ?, updated_at = ? WHERE id = ?`,
		s.d.MetadataPath(pk), s.d.MetadataPath(bk), teamID, time.Now().UnixNano(), sb.ID); err != nil {
		return nil, err
	}
	if err := tx.Commit(); err != nil {
		return nil, err
	}
	return s.GetSandbox(ctx, sb.ID)
}

// liveStates are the sandbox states that hold node resources.
var liveStates = []any{string(store.StateCreating), string(store.StateRunning), string(store.StatePausing), string(store.StatePaused), string(store.StateResuming)}

// checkSandboxQuota fails with a *store.QuotaError when one more sandbox
// of sb's size would exceed teamID's quota. It reads inside tx, so with the
// insert that follows it is one serialised step (the dialect's isolation).
func checkSandboxQuota(ctx context.Context, tx *txn, teamID string, sb *store.Sandbox) error {
	if teamID == store.SystemTeamID {
		return nil
	}
	t, err := scanTeam(tx.QueryRowContext(ctx, `SELECT `+teamCols+` FROM teams WHERE id=?`, teamID))
	if errors.Is(err, store.ErrNotFound) {
		return fmt.Errorf("%w: team %s does not exist", store.ErrNotFound, teamID)
	}
	if err != nil {
		return err
	}
	q := t.Quota
	if q == (store.Quota{}) {
		return nil
	}
	var n, cpu, mem, disk int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*), COALESCE(SUM(cpu_count),0), COALESCE(SUM(memory_mb),0), COALESCE(SUM(disk_size_mb),0)
FROM sandboxes WHERE team_id = ? AND id != ? AND state IN (?,?,?,?,?)`, append([]any{teamID, sb.ID}, liveStates...)...).Scan(&n, &cpu, &mem, &disk); err != nil {
		return err
	}
	switch {
	case q.MaxSandboxes > 0 && n+1 > q.MaxSandboxes:
		return &store.QuotaError{Quota: "concurrent sandboxes", Limit: q.MaxSandboxes}
	case q.MaxVCPUs > 0 && cpu+sb.CPUCount > q.MaxVCPUs:
		return &store.QuotaError{Quota: "vCPUs", Limit: q.MaxVCPUs}
	case q.MaxMemoryMB > 0 && mem+sb.MemoryMB > q.MaxMemoryMB:
		return &store.QuotaError{Quota: "memory MiB", Limit: q.MaxMemoryMB}
	case q.MaxDiskMB > 0 && disk+sb.DiskSizeMB > q.MaxDiskMB:
		return &store.QuotaError{Quota: "disk MiB", Limit: q.MaxDiskMB}
	}
	return nil
}

// CountSandboxes counts rows in the given states (all when empty).
func (s *Store) CountSandboxes(ctx context.Context, states []store.SandboxState) (int, error) {
	q := `SELECT COUNT(*) FROM sandboxes`
	var args []any
	if len(states) > 0 {
		q += ` WHERE state IN (` + strings.TrimSuffix(strings.Repeat("?,", len(states)), ",") + `)`
		for _, st := range states {
			args = append(args, string(st))
		}
	}
	var n int
	err := s.db.QueryRowContext(ctx, q, args...).Scan(&n)
	return n, err
}

const keyCols = `id, team_id, admin, name, hash, prefix, created_at, last_used`

// CreateAPIKey stores a key (hash only) of an existing team.
func (s *Store) CreateAPIKey(ctx context.Context, k *store.APIKey) error {
	if k.TeamID == store.SystemTeamID {
		return fmt.Errorf("%w: an API key needs a team", store.ErrNotFound)
	}
	res, err := s.db.ExecContext(ctx, `INSERT INTO api_keys(`+keyCols+`) SELECT `+s.typedList("text", "text", "boolean", "text", "text", "text", "bigint", "bigint")+` WHERE EXISTS (SELECT 1 FROM teams WHERE id=?)`,
		k.ID, k.TeamID, k.Admin, k.Name, k.Hash, k.Prefix, ts(k.CreatedAt), ts(k.LastUsed), k.TeamID)
	if s.d.IsConstraint(err) {
		return fmt.Errorf("%w: api key exists", store.ErrConflict)
	}
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("%w: team %s does not exist", store.ErrNotFound, k.TeamID)
	}
	return nil
}

func scanKey(r scanner) (*store.APIKey, error) {
	var k store.APIKey
	var created, used int64
	if err := r.Scan(&k.ID, &k.TeamID, &k.Admin, &k.Name, &k.Hash, &k.Prefix, &created, &used); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	k.CreatedAt, k.LastUsed = fromTS(created), fromTS(used)
	return &k, nil
}

// APIKeyByHash looks a key up by the hash of its secret (never cached).
func (s *Store) APIKeyByHash(ctx context.Context, hash string) (*store.APIKey, error) {
	return scanKey(s.db.QueryRowContext(ctx, `SELECT `+keyCols+` FROM api_keys WHERE hash=?`, hash))
}

// ListAPIKeys returns all keys, oldest first.
func (s *Store) ListAPIKeys(ctx context.Context) ([]*store.APIKey, error) {
	return queryAll(ctx, s.db, scanKey, `SELECT `+keyCols+` FROM api_keys ORDER BY created_at, id`)
}

// DeleteAPIKey removes a key; ErrNotFound if absent.
func (s *Store) DeleteAPIKey(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM api_keys WHERE id=?`, id)
	if err != nil {
		return err
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// TouchAPIKey records the last use time.
func (s *Store) TouchAPIKey(ctx context.Context, id string, t time.Time) error {
	_, err := s.db.ExecContext(ctx, `UPDATE api_keys SET last_used=? WHERE id=?`, ts(t), id)
	return err
}

// AppendEvent records an event.
func (s *Store) AppendEvent(ctx context.Context, e *store.Event) error {
	if e.Time.IsZero() {
		e.Time = time.Now()
	}
	if e.Level == "" {
		e.Level = "info"
	}
	return s.db.QueryRowContext(ctx, `INSERT INTO events(sandbox_id, volume_id, type, level, message, time) VALUES(?,?,?,?,?,?) RETURNING id`,
		e.SandboxID, e.VolumeID, e.Type, e.Level, e.Message, ts(e.Time)).Scan(&e.ID)
}

// ListEvents returns a sandbox's events at or after since, oldest first.
func (s *Store) ListEvents(ctx context.Context, sandboxID string, since time.Time, limit int) ([]*store.Event, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.db.QueryContext(ctx, `SELECT id, sandbox_id, volume_id, type, level, message, time FROM events WHERE sandbox_id=? AND time>=? ORDER BY time, id LIMIT ?`,
		sandboxID, ts(since), limit)
	if err != nil {
		return nil, err
	}
	return scanEvents(rows)
}

// ListVolumeEvents returns a volume's events, oldest first.
func (s *Store) ListVolumeEvents(ctx context.Context, volumeID string, limit int) ([]*store.Event, error) {
	if limit <= 0 {
		limit = 1000
	}
	rows, err := s.db.QueryContext(ctx, `SELECT id, sandbox_id, volume_id, type, level, message, time FROM events WHERE volume_id=? ORDER BY time, id LIMIT ?`,
		volumeID, limit)
	if err != nil {
		return nil, err
	}
	return scanEvents(rows)
}

func scanEvents(rows *sql.Rows) ([]*store.Event, error) {
	defer rows.Close()
	var out []*store.Event
	for rows.Next() {
		var e store.Event
		var t int64
		if err := rows.Scan(&e.ID, &e.SandboxID, &e.VolumeID, &e.Type, &e.Level, &e.Message, &t); err != nil {
			return nil, err
		}
		e.Time = fromTS(t)
		out = append(out, &e)
	}
	return out, rows.Err()
}

// typedList is the placeholders of arguments of the given SQL types.
func (s *Store) typedList(sqlTypes ...string) string {
	out := make([]string, len(sqlTypes))
	for i, t := range sqlTypes {
		out[i] = s.d.typed(t)
	}
	return strings.Join(out, ", ")
}
