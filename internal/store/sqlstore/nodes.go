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

const nodeCols = `id, address, labels, milli_cpu, memory_mib, disk_mib, runtime, version, volume_drivers, accelerators,
cordoned, draining, registered_at, heartbeat_at, data_address, templates`

func scanNode(r scanner) (*store.Node, error) {
	var n store.Node
	var labels, drivers, templates string
	var registered, heartbeat int64
	if err := r.Scan(&n.ID, &n.Address, &labels, &n.Capacity.MilliCPU, &n.Capacity.MemoryMiB, &n.Capacity.DiskMiB,
		&n.Runtime, &n.Version, &drivers, &n.Accelerators, &n.Cordoned, &n.Draining, &registered, &heartbeat,
		&n.DataAddress, &templates); err != nil {
		if errors.Is(err, sql.ErrNoRows) {
			return nil, store.ErrNotFound
		}
		return nil, err
	}
	if err := json.Unmarshal([]byte(labels), &n.Labels); err != nil {
		return nil, fmt.Errorf("node %s labels: %w", n.ID, err)
	}
	if err := json.Unmarshal([]byte(drivers), &n.VolumeDrivers); err != nil {
		return nil, fmt.Errorf("node %s volume drivers: %w", n.ID, err)
	}
	if err := json.Unmarshal([]byte(templates), &n.Templates); err != nil {
		return nil, fmt.Errorf("node %s templates: %w", n.ID, err)
	}
	n.RegisteredAt, n.HeartbeatAt = fromTS(registered), fromTS(heartbeat)
	return &n, nil
}

func driversOrEmpty(d []string) []string {
	if d == nil {
		return []string{}
	}
	return d
}

// RegisterNode implements store.NodeStore.
func (s *Store) RegisterNode(ctx context.Context, n *store.Node) error {
	if n.ID == "" {
		return fmt.Errorf("%w: a node needs an ID", store.ErrConflict)
	}
	if n.HeartbeatAt.IsZero() {
		n.HeartbeatAt = time.Now().UTC()
	}
	if n.RegisteredAt.IsZero() {
		n.RegisteredAt = n.HeartbeatAt
	}
	_, err := s.db.ExecContext(ctx, `INSERT INTO nodes(`+nodeCols+`) VALUES(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)
ON CONFLICT(id) DO UPDATE SET address=excluded.address, data_address=excluded.data_address, templates=excluded.templates, labels=excluded.labels, milli_cpu=excluded.milli_cpu,
memory_mib=excluded.memory_mib, disk_mib=excluded.disk_mib, runtime=excluded.runtime, version=excluded.version,
volume_drivers=excluded.volume_drivers, accelerators=excluded.accelerators, heartbeat_at=excluded.heartbeat_at`,
		n.ID, n.Address, js(orEmpty(n.Labels)), n.Capacity.MilliCPU, n.Capacity.MemoryMiB, n.Capacity.DiskMiB,
		n.Runtime, n.Version, js(driversOrEmpty(n.VolumeDrivers)), n.Accelerators, n.Cordoned, n.Draining,
		ts(n.RegisteredAt), ts(n.HeartbeatAt), n.DataAddress, js(driversOrEmpty(n.Templates)))
	return err
}

// HeartbeatNode implements store.NodeStore.
func (s *Store) HeartbeatNode(ctx context.Context, id string, hb store.NodeHeartbeat) error {
	if hb.Time.IsZero() {
		hb.Time = time.Now().UTC()
	}
	res, err := s.db.ExecContext(ctx, `UPDATE nodes SET address=?, data_address=?, labels=?, milli_cpu=?, memory_mib=?, disk_mib=?,
volume_drivers=?, accelerators=?, templates=?, heartbeat_at=? WHERE id=?`,
		hb.Address, hb.DataAddress, js(orEmpty(hb.Labels)), hb.Capacity.MilliCPU, hb.Capacity.MemoryMiB, hb.Capacity.DiskMiB,
		js(driversOrEmpty(hb.VolumeDrivers)), hb.Accelerators, js(driversOrEmpty(hb.Templates)), ts(hb.Time), id)
	return affected(res, err, "node", id)
}

// affected turns an UPDATE that matched no row into ErrNotFound.
func affected(res sql.Result, err error, what, id string) error {
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil {
		return err
	} else if n == 0 {
		return fmt.Errorf("%w: %s %s", store.ErrNotFound, what, id)
	}
	return nil
}

// GetNode implements store.NodeStore.
func (s *Store) GetNode(ctx context.Context, id string) (*store.Node, error) {
	n, err := scanNode(s.db.QueryRowContext(ctx, `SELECT `+nodeCols+` FROM nodes WHERE id=?`, id))
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("%w: node %s", store.ErrNotFound, id)
	}
	return n, err
}

// ListNodes implements store.NodeStore.
func (s *Store) ListNodes(ctx context.Context) ([]*store.Node, error) {
	return queryAll(ctx, s.db, scanNode, `SELECT `+nodeCols+` FROM nodes ORDER BY id`)
}

// SetNodeFlags implements store.NodeStore.
func (s *Store) SetNodeFlags(ctx context.Context, id string, cordoned, draining bool) (*store.Node, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE nodes SET cordoned=?, draining=? WHERE id=?`, cordoned, draining, id)
	if err := affected(res, err, "node", id); err != nil {
		return nil, err
	}
	return s.GetNode(ctx, id)
}

// ForgetNode implements store.NodeStore. The count and the delete are one
// serializable transaction (SQLite: one writer; PostgreSQL: SERIALIZABLE):
// it sees every sandbox committed before it, and a create committing
// alongside is ordered after the forget.
func (s *Store) ForgetNode(ctx context.Context, id string) error {
	return retry(ctx, s.d, func() error { return s.forgetNodeTx(ctx, id) })
}

func (s *Store) forgetNodeTx(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	// A sandbox lost while paused, with its pause's package and no volume
	// (control's movesWhenLost), resumes elsewhere at its next connect: it
	// does not hold the node, and its row stays.
	var live int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM sandboxes WHERE node=? AND state != ?
AND NOT (state = ? AND pause_package != '' AND volumes IN ('', '[]', 'null'))`,
		id, string(store.StateKilled), string(store.StateLost)).Scan(&live); err != nil {
		return err
	}
	if live > 0 {
		return &store.NodeInUseError{Node: id, Sandboxes: live}
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM nodes WHERE id=?`, id)
	if err != nil {
		return err
	}
	registered, err := res.RowsAffected()
	if err != nil {
		return err
	}
	var joined bool
	var prev int64
	err = tx.QueryRowContext(ctx, `SELECT joined, revoked_at FROM node_identities WHERE node_id=?`, id).Scan(&joined, &prev)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	if registered == 0 && !joined {
		return fmt.Errorf("%w: node %s", store.ErrNotFound, id)
	}
	// The ID is free to join again, and every certificate issued for it
	// until now is revoked: clusterpki refuses a NotBefore before this
	// time. Certificate times are whole seconds, so it is this second,
	// and always later than the previous forget's (a certificate a re-join
	// started at that one is revoked by this one).
	revoked := time.Now().UTC().Truncate(time.Second)
	if p := fromTS(prev); !p.IsZero() && !revoked.After(p) {
		revoked = p.Truncate(time.Second).Add(time.Second)
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO node_identities(node_id, joined, revoked_at) VALUES(?,?,?)
ON CONFLICT(node_id) DO UPDATE SET joined=excluded.joined, revoked_at=excluded.revoked_at`, id, false, ts(revoked)); err != nil {
		return err
	}
	// The reservations go with the allocatable row (ON DELETE CASCADE).
	if _, err := tx.ExecContext(ctx, `DELETE FROM node_allocatable WHERE node_id=?`, id); err != nil {
		return err
	}
	// The operator declares the node dead: the volume references of its
	// (killed) sandboxes, kept until the node confirmed the detach, go now,
	// so the volumes' delete guard no longer counts them (the volume seed).
	if _, err := tx.ExecContext(ctx, `DELETE FROM volume_attachments WHERE node=?`, id); err != nil {
		return err
	}
	return tx.Commit()
}

// SetAllocatable implements store.CapacityLedger.
func (s *Store) SetAllocatable(ctx context.Context, nodeID string, c store.Capacity) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO node_allocatable(node_id, milli_cpu, memory_mib, disk_mib) VALUES(?,?,?,?)
ON CONFLICT(node_id) DO UPDATE SET milli_cpu=excluded.milli_cpu, memory_mib=excluded.memory_mib, disk_mib=excluded.disk_mib`,
		nodeID, c.MilliCPU, c.MemoryMiB, c.DiskMiB)
	return err
}

// committedSQL sums a node's counting reservations: those whose sandbox
// has no row yet or a live one.
const committedSQL = `SELECT COALESCE(SUM(r.milli_cpu), 0), COALESCE(SUM(r.memory_mib), 0), COALESCE(SUM(r.disk_mib), 0)
FROM capacity_reservations r LEFT JOIN sandboxes s ON s.id = r.sandbox_id
WHERE r.node_id = ? AND (s.state IS NULL OR s.state != 'killed')`

// ReserveCapacity implements store.CapacityLedger. The read of what is
// committed and the insert are one serializable transaction. SQLite has
// one writer, so the two are one step for every caller; on PostgreSQL, of
// two replicas that both read room for one more, one commits and the other
// fails with 40001 and is retried from the start, where it sees the first.
func (s *Store) ReserveCapacity(ctx context.Context, sandboxID, nodeID string, c store.Capacity, check func(allocatable, committed store.Capacity) error) error {
	return retry(ctx, s.d, func() error { return s.reserveTx(ctx, sandboxID, nodeID, c, check) })
}

func (s *Store) reserveTx(ctx context.Context, sandboxID, nodeID string, c store.Capacity, check func(allocatable, committed store.Capacity) error) error {
	tx, err := s.db.BeginTx(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	var have store.Capacity
	var haveNode string
	err = tx.QueryRowContext(ctx, `SELECT node_id, milli_cpu, memory_mib, disk_mib FROM capacity_reservations WHERE sandbox_id=?`, sandboxID).
		Scan(&haveNode, &have.MilliCPU, &have.MemoryMiB, &have.DiskMiB)
	switch {
	case err == nil:
		if haveNode == nodeID && have == c {
			return nil
		}
		return fmt.Errorf("%w: sandbox %s holds %+v on node %s", store.ErrConflict, sandboxID, have, haveNode)
	case !errors.Is(err, sql.ErrNoRows):
		return err
	}
	var alloc, committed store.Capacity
	err = tx.QueryRowContext(ctx, `SELECT milli_cpu, memory_mib, disk_mib FROM node_allocatable WHERE node_id=?`, nodeID).
		Scan(&alloc.MilliCPU, &alloc.MemoryMiB, &alloc.DiskMiB)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w: node %s has no allocatable capacity", store.ErrNotFound, nodeID)
	}
	if err != nil {
		return err
	}
	if err := tx.QueryRowContext(ctx, committedSQL, nodeID).Scan(&committed.MilliCPU, &committed.MemoryMiB, &committed.DiskMiB); err != nil {
		return err
	}
	if err := check(alloc, committed); err != nil {
		return err
	}
	if _, err := tx.ExecContext(ctx, `INSERT INTO capacity_reservations(sandbox_id, node_id, milli_cpu, memory_mib, disk_mib) VALUES(?,?,?,?,?)`,
		sandboxID, nodeID, c.MilliCPU, c.MemoryMiB, c.DiskMiB); err != nil {
		if s.d.IsConstraint(err) {
			// A concurrent reserve of the same sandbox won; retrying reads it.
			return fmt.Errorf("%w: sandbox %s reserved concurrently", store.ErrConflict, sandboxID)
		}
		return err
	}
	return tx.Commit()
}

// ReleaseCapacity implements store.CapacityLedger.
func (s *Store) ReleaseCapacity(ctx context.Context, sandboxID string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM capacity_reservations WHERE sandbox_id=?`, sandboxID)
	return err
}

// AllocatableCapacity implements store.CapacityLedger.
func (s *Store) AllocatableCapacity(ctx context.Context) (map[string]store.Capacity, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT node_id, milli_cpu, memory_mib, disk_mib FROM node_allocatable`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]store.Capacity{}
	for rows.Next() {
		var id string
		var c store.Capacity
		if err := rows.Scan(&id, &c.MilliCPU, &c.MemoryMiB, &c.DiskMiB); err != nil {
			return nil, err
		}
		out[id] = c
	}
	return out, rows.Err()
}

// CommittedCapacity implements store.CapacityLedger.
func (s *Store) CommittedCapacity(ctx context.Context) (map[string]store.Capacity, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT a.node_id, COALESCE(SUM(r.milli_cpu), 0), COALESCE(SUM(r.memory_mib), 0), COALESCE(SUM(r.disk_mib), 0)
FROM node_allocatable a
LEFT JOIN (capacity_reservations r LEFT JOIN sandboxes s ON s.id = r.sandbox_id)
  ON r.node_id = a.node_id AND (s.state IS NULL OR s.state != 'killed')
GROUP BY a.node_id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]store.Capacity{}
	for rows.Next() {
		var id string
		var c store.Capacity
		if err := rows.Scan(&id, &c.MilliCPU, &c.MemoryMiB, &c.DiskMiB); err != nil {
			return nil, err
		}
		out[id] = c
	}
	return out, rows.Err()
}
