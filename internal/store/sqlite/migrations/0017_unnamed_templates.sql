-- A template may have no name: CubeAPI's create-from-image makes unnamed
-- templates, and an alias moves between templates. Names stay unique per
-- team through template_names (its primary key); the primary name is
-- unique only when set. SQLite cannot drop a table constraint: the table
-- is rebuilt (foreign keys are off during migrations, see apply).
CREATE TABLE templates_new (
  id TEXT PRIMARY KEY,
  team_id TEXT NOT NULL,
  primary_name TEXT NOT NULL,
  public INTEGER NOT NULL DEFAULT 0,
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
  build_count INTEGER NOT NULL DEFAULT 0,
  spawn_count INTEGER NOT NULL DEFAULT 0,
  last_spawned_at INTEGER NOT NULL DEFAULT 0,
  pool_size INTEGER NOT NULL DEFAULT 0,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  accelerators TEXT NOT NULL DEFAULT ''
);
INSERT INTO templates_new(id, team_id, primary_name, public, cpu_count, memory_mb, disk_size_mb, start_cmd, ready_cmd, run_as, workdir,
    ready_build_id, ready_image, latest_build_id, build_status, build_count, spawn_count, last_spawned_at, pool_size, created_at, updated_at, accelerators)
  SELECT id, team_id, primary_name, public, cpu_count, memory_mb, disk_size_mb, start_cmd, ready_cmd, run_as, workdir,
    ready_build_id, ready_image, latest_build_id, build_status, build_count, spawn_count, last_spawned_at, pool_size, created_at, updated_at, accelerators
  FROM templates;
DROP TABLE templates;
ALTER TABLE templates_new RENAME TO templates;
CREATE INDEX templates_team ON templates(team_id, created_at);
CREATE UNIQUE INDEX templates_primary_name ON templates(team_id, primary_name) WHERE primary_name <> '';
