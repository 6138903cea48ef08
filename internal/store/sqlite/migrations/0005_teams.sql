-- Tenancy: teams own API keys, sandboxes, volumes and templates. Everything
-- an older install holds moves into the team 'default', and its existing
-- keys stay admins of it (they could do everything before the upgrade).
-- Runs with foreign keys off (see migrate): volumes, templates and
-- template_names are rebuilt to make their names unique per team.
CREATE TABLE teams (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  max_sandboxes INTEGER NOT NULL DEFAULT 0,
  max_vcpus INTEGER NOT NULL DEFAULT 0,
  max_memory_mb INTEGER NOT NULL DEFAULT 0,
  max_disk_mb INTEGER NOT NULL DEFAULT 0,
  max_volumes INTEGER NOT NULL DEFAULT 0,
  created_at INTEGER NOT NULL
);
INSERT INTO teams(id, name, created_at) VALUES ('default', 'default', CAST(strftime('%s', 'now') AS INTEGER) * 1000000000);

ALTER TABLE api_keys ADD COLUMN team_id TEXT NOT NULL DEFAULT 'default';
ALTER TABLE api_keys ADD COLUMN admin INTEGER NOT NULL DEFAULT 0;
UPDATE api_keys SET admin = 1;
CREATE INDEX api_keys_team ON api_keys(team_id);

ALTER TABLE sandboxes ADD COLUMN team_id TEXT NOT NULL DEFAULT 'default';
CREATE INDEX sandboxes_team ON sandboxes(team_id, state);

CREATE TABLE volumes_new (
  id TEXT PRIMARY KEY,
  team_id TEXT NOT NULL,
  name TEXT NOT NULL,
  driver TEXT NOT NULL,
  state TEXT NOT NULL,
  token TEXT NOT NULL DEFAULT '',
  private_data TEXT NOT NULL DEFAULT '',
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE (team_id, name)
);
INSERT INTO volumes_new(id, team_id, name, driver, state, token, private_data, created_at, updated_at)
  SELECT id, 'default', name, driver, state, token, private_data, created_at, updated_at FROM volumes;
DROP TABLE volumes;
ALTER TABLE volumes_new RENAME TO volumes;

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
  accelerators TEXT NOT NULL DEFAULT '',
  UNIQUE (team_id, primary_name)
);
INSERT INTO templates_new(id, team_id, primary_name, public, cpu_count, memory_mb, disk_size_mb, start_cmd, ready_cmd, run_as, workdir,
    ready_build_id, ready_image, latest_build_id, build_status, build_count, spawn_count, last_spawned_at, pool_size, created_at, updated_at, accelerators)
  SELECT id, 'default', primary_name, public, cpu_count, memory_mb, disk_size_mb, start_cmd, ready_cmd, run_as, workdir,
    ready_build_id, ready_image, latest_build_id, build_status, build_count, spawn_count, last_spawned_at, pool_size, created_at, updated_at, accelerators
  FROM templates;
DROP TABLE templates;
ALTER TABLE templates_new RENAME TO templates;
CREATE INDEX templates_team ON templates(team_id, created_at);

CREATE TABLE template_names_new (
  team_id TEXT NOT NULL,
  name TEXT NOT NULL,
  template_id TEXT NOT NULL REFERENCES templates(id) ON DELETE CASCADE,
  PRIMARY KEY (team_id, name)
);
INSERT INTO template_names_new(team_id, name, template_id) SELECT 'default', name, template_id FROM template_names;
DROP TABLE template_names;
ALTER TABLE template_names_new RENAME TO template_names;
CREATE INDEX template_names_template ON template_names(template_id);
CREATE INDEX template_names_name ON template_names(name);
