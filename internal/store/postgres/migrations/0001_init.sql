-- The schema of SQLite's migrations 0001-0008 as it stands after them (a
-- PostgreSQL database starts here; there is no pre-tenancy install to
-- migrate). Times are Unix nanoseconds (0 = unset), as in SQLite, so both
-- backends store the same values. JSON columns are TEXT, cast to jsonb
-- where a query looks inside them.
CREATE TABLE teams (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  max_sandboxes INTEGER NOT NULL DEFAULT 0,
  max_vcpus INTEGER NOT NULL DEFAULT 0,
  max_memory_mb INTEGER NOT NULL DEFAULT 0,
  max_disk_mb INTEGER NOT NULL DEFAULT 0,
  max_volumes INTEGER NOT NULL DEFAULT 0,
  max_volume_mb INTEGER NOT NULL DEFAULT 0,
  created_at BIGINT NOT NULL
);
INSERT INTO teams(id, name, created_at) VALUES ('default', 'default', (extract(epoch FROM now()))::bigint * 1000000000);

CREATE TABLE sandboxes (
  id TEXT PRIMARY KEY,
  team_id TEXT NOT NULL DEFAULT 'default',
  template_id TEXT NOT NULL,
  alias TEXT NOT NULL DEFAULT '',
  state TEXT NOT NULL,
  node TEXT NOT NULL DEFAULT '',
  metadata TEXT NOT NULL DEFAULT '{}',
  env_vars TEXT NOT NULL DEFAULT '{}',
  envd_token TEXT NOT NULL DEFAULT '',
  traffic_token TEXT NOT NULL DEFAULT '',
  cpu_count INTEGER NOT NULL,
  memory_mb INTEGER NOT NULL,
  disk_size_mb INTEGER NOT NULL,
  network TEXT NOT NULL DEFAULT '{}',
  auto_pause BOOLEAN NOT NULL DEFAULT false,
  auto_resume BOOLEAN NOT NULL DEFAULT false,
  addr TEXT NOT NULL DEFAULT '',
  api_key_id TEXT NOT NULL DEFAULT '',
  started_at BIGINT NOT NULL,
  end_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  killed_at BIGINT NOT NULL DEFAULT 0,
  kill_reason TEXT NOT NULL DEFAULT '',
  volumes TEXT NOT NULL DEFAULT '[]',
  default_user TEXT NOT NULL DEFAULT '',
  accelerators TEXT NOT NULL DEFAULT '',
  layers TEXT NOT NULL DEFAULT '',
  pause_memory BOOLEAN NOT NULL DEFAULT true
);
CREATE INDEX sandboxes_state ON sandboxes(state, started_at);
CREATE INDEX sandboxes_team ON sandboxes(team_id, state);

CREATE TABLE api_keys (
  id TEXT PRIMARY KEY,
  team_id TEXT NOT NULL,
  admin BOOLEAN NOT NULL DEFAULT false,
  name TEXT NOT NULL,
  hash TEXT NOT NULL UNIQUE,
  prefix TEXT NOT NULL,
  created_at BIGINT NOT NULL,
  last_used BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX api_keys_team ON api_keys(team_id);

CREATE TABLE events (
  id BIGSERIAL PRIMARY KEY,
  sandbox_id TEXT NOT NULL,
  volume_id TEXT NOT NULL DEFAULT '',
  type TEXT NOT NULL,
  level TEXT NOT NULL,
  message TEXT NOT NULL,
  time BIGINT NOT NULL
);
CREATE INDEX events_sandbox ON events(sandbox_id, time);
CREATE INDEX events_volume ON events(volume_id, time);

-- A volume's cluster-wide reference count is its number of attachment
-- rows (see SQLite's 0002_volumes.sql); the foreign key makes a row
-- delete that would leave one dangling fail.
CREATE TABLE volumes (
  id TEXT PRIMARY KEY,
  team_id TEXT NOT NULL,
  name TEXT NOT NULL,
  driver TEXT NOT NULL,
  state TEXT NOT NULL,
  token TEXT NOT NULL DEFAULT '',
  private_data TEXT NOT NULL DEFAULT '',
  size_mb INTEGER NOT NULL DEFAULT 0,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  UNIQUE (team_id, name)
);

CREATE TABLE volume_attachments (
  volume_id TEXT NOT NULL REFERENCES volumes(id),
  sandbox_id TEXT NOT NULL,
  node TEXT NOT NULL,
  path TEXT NOT NULL,
  read_only BOOLEAN NOT NULL DEFAULT false,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (volume_id, sandbox_id)
);
CREATE INDEX volume_attachments_sandbox ON volume_attachments(sandbox_id);

CREATE TABLE templates (
  id TEXT PRIMARY KEY,
  team_id TEXT NOT NULL,
  primary_name TEXT NOT NULL,
  public BOOLEAN NOT NULL DEFAULT false,
  cpu_count INTEGER NOT NULL,
  memory_mb INTEGER NOT NULL,
  disk_size_mb INTEGER NOT NULL,
  start_cmd TEXT NOT NULL DEFAULT '',
  ready_cmd TEXT NOT NULL DEFAULT '',
  run_as TEXT NOT NULL DEFAULT '',
  workdir TEXT NOT NULL DEFAULT '',
  ready_build_id TEXT NOT NULL DEFAULT '',
  ready_image TEXT NOT NULL DEFAULT '',
  latest_build_id TEXT NOT NULL DEFAULT '',
  build_status TEXT NOT NULL,
  build_count BIGINT NOT NULL DEFAULT 0,
  spawn_count BIGINT NOT NULL DEFAULT 0,
  last_spawned_at BIGINT NOT NULL DEFAULT 0,
  pool_size INTEGER NOT NULL DEFAULT 0,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  accelerators TEXT NOT NULL DEFAULT '',
  UNIQUE (team_id, primary_name)
);
CREATE INDEX templates_team ON templates(team_id, created_at);

CREATE TABLE template_names (
  team_id TEXT NOT NULL,
  name TEXT NOT NULL,
  template_id TEXT NOT NULL REFERENCES templates(id) ON DELETE CASCADE,
  PRIMARY KEY (team_id, name)
);
CREATE INDEX template_names_template ON template_names(template_id);
CREATE INDEX template_names_name ON template_names(name);

CREATE TABLE template_builds (
  id TEXT PRIMARY KEY,
  template_id TEXT NOT NULL REFERENCES templates(id) ON DELETE CASCADE,
  status TEXT NOT NULL,
  cpu_count INTEGER NOT NULL,
  memory_mb INTEGER NOT NULL,
  disk_size_mb INTEGER NOT NULL,
  image TEXT NOT NULL DEFAULT '',
  rootfs TEXT NOT NULL DEFAULT '',
  reason TEXT NOT NULL DEFAULT '',
  step TEXT NOT NULL DEFAULT '',
  spec TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  finished_at BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX template_builds_template ON template_builds(template_id, created_at);

CREATE TABLE template_build_logs (
  build_id TEXT NOT NULL REFERENCES template_builds(id) ON DELETE CASCADE,
  seq INTEGER NOT NULL,
  time BIGINT NOT NULL,
  level TEXT NOT NULL,
  message TEXT NOT NULL,
  step TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (build_id, seq)
);

CREATE TABLE template_tags (
  template_id TEXT NOT NULL REFERENCES templates(id) ON DELETE CASCADE,
  tag TEXT NOT NULL,
  build_id TEXT NOT NULL,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (template_id, tag)
);

CREATE TABLE idempotency_keys (
  key TEXT PRIMARY KEY,
  body_hash TEXT NOT NULL,
  response TEXT NOT NULL,
  created_at BIGINT NOT NULL
);

CREATE TABLE snapshots (
  id TEXT PRIMARY KEY,
  team_id TEXT NOT NULL,
  sandbox_id TEXT NOT NULL,
  source_template_id TEXT NOT NULL,
  node TEXT NOT NULL,
  kind TEXT NOT NULL,
  runtime TEXT NOT NULL,
  layers TEXT NOT NULL,
  checkpoint TEXT NOT NULL DEFAULT '',
  size_bytes BIGINT NOT NULL DEFAULT 0,
  volumes TEXT NOT NULL DEFAULT '[]',
  env_vars TEXT NOT NULL DEFAULT '{}',
  default_user TEXT NOT NULL DEFAULT '',
  agent_token TEXT NOT NULL DEFAULT '',
  internal BOOLEAN NOT NULL DEFAULT false,
  created_at BIGINT NOT NULL,
  deleted_at BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX snapshots_team ON snapshots(team_id, deleted_at, created_at);
CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id);
CREATE INDEX snapshots_source_template ON snapshots(source_template_id);

CREATE TABLE secrets (
  id TEXT PRIMARY KEY,
  team_id TEXT NOT NULL,
  name TEXT NOT NULL,
  version INTEGER NOT NULL,
  metadata TEXT NOT NULL DEFAULT '{}',
  sealed BYTEA NOT NULL,
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  UNIQUE (team_id, name)
);
CREATE INDEX secrets_team ON secrets(team_id, created_at, id);
