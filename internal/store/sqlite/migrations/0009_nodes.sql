-- The node registry, and the capacity ledger the scheduler reserves through.
CREATE TABLE nodes (
  id TEXT PRIMARY KEY,
  address TEXT NOT NULL DEFAULT '',
  labels TEXT NOT NULL DEFAULT '{}',
  milli_cpu INTEGER NOT NULL DEFAULT 0,
  memory_mib INTEGER NOT NULL DEFAULT 0,
  disk_mib INTEGER NOT NULL DEFAULT 0,
  runtime TEXT NOT NULL DEFAULT '',
  version TEXT NOT NULL DEFAULT '',
  volume_drivers TEXT NOT NULL DEFAULT '[]',
  accelerators TEXT NOT NULL DEFAULT '',
  cordoned INTEGER NOT NULL DEFAULT 0,
  draining INTEGER NOT NULL DEFAULT 0,
  registered_at INTEGER NOT NULL,
  heartbeat_at INTEGER NOT NULL
);

CREATE TABLE node_allocatable (
  node_id TEXT PRIMARY KEY,
  milli_cpu INTEGER NOT NULL,
  memory_mib INTEGER NOT NULL,
  disk_mib INTEGER NOT NULL
);

CREATE TABLE capacity_reservations (
  sandbox_id TEXT PRIMARY KEY,
  node_id TEXT NOT NULL REFERENCES node_allocatable(node_id) ON DELETE CASCADE,
  milli_cpu INTEGER NOT NULL,
  memory_mib INTEGER NOT NULL,
  disk_mib INTEGER NOT NULL
);
CREATE INDEX capacity_reservations_node ON capacity_reservations(node_id);
CREATE INDEX sandboxes_node ON sandboxes(node, state);
