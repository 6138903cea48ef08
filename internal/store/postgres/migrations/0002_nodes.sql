-- The node registry, and the capacity ledger the scheduler reserves through.
CREATE TABLE nodes (
  id TEXT PRIMARY KEY,
  address TEXT NOT NULL DEFAULT '',
  labels TEXT NOT NULL DEFAULT '{}',
  milli_cpu BIGINT NOT NULL DEFAULT 0,
  memory_mib BIGINT NOT NULL DEFAULT 0,
  disk_mib BIGINT NOT NULL DEFAULT 0,
  runtime TEXT NOT NULL DEFAULT '',
  version TEXT NOT NULL DEFAULT '',
  volume_drivers TEXT NOT NULL DEFAULT '[]',
  accelerators TEXT NOT NULL DEFAULT '',
  cordoned BOOLEAN NOT NULL DEFAULT false,
  draining BOOLEAN NOT NULL DEFAULT false,
  registered_at BIGINT NOT NULL,
  heartbeat_at BIGINT NOT NULL
);

CREATE TABLE node_allocatable (
  node_id TEXT PRIMARY KEY,
  milli_cpu BIGINT NOT NULL,
  memory_mib BIGINT NOT NULL,
  disk_mib BIGINT NOT NULL
);

CREATE TABLE capacity_reservations (
  sandbox_id TEXT PRIMARY KEY,
  node_id TEXT NOT NULL REFERENCES node_allocatable(node_id) ON DELETE CASCADE,
  milli_cpu BIGINT NOT NULL,
  memory_mib BIGINT NOT NULL,
  disk_mib BIGINT NOT NULL
);
CREATE INDEX capacity_reservations_node ON capacity_reservations(node_id);
CREATE INDEX sandboxes_node ON sandboxes(node, state);
