-- The template catalog. A template's names (primary name, name:tag) are
-- unique across templates; builds keep their own status so a failed rebuild
-- never touches the ready image the template still serves.
CREATE TABLE templates (
  id TEXT PRIMARY KEY,
  primary_name TEXT NOT NULL UNIQUE,
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
  updated_at INTEGER NOT NULL
);

CREATE TABLE template_names (
  name TEXT PRIMARY KEY,
  template_id TEXT NOT NULL REFERENCES templates(id) ON DELETE CASCADE
);
CREATE INDEX template_names_template ON template_names(template_id);

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
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  finished_at INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX template_builds_template ON template_builds(template_id, created_at);

CREATE TABLE template_build_logs (
  build_id TEXT NOT NULL REFERENCES template_builds(id) ON DELETE CASCADE,
  seq INTEGER NOT NULL,
  time INTEGER NOT NULL,
  level TEXT NOT NULL,
  message TEXT NOT NULL,
  step TEXT NOT NULL DEFAULT '',
  PRIMARY KEY (build_id, seq)
);

CREATE TABLE template_tags (
  template_id TEXT NOT NULL REFERENCES templates(id) ON DELETE CASCADE,
  tag TEXT NOT NULL,
  build_id TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (template_id, tag)
);

CREATE TABLE idempotency_keys (
  key TEXT PRIMARY KEY,
  body_hash TEXT NOT NULL,
  response TEXT NOT NULL,
  created_at INTEGER NOT NULL
);

-- The user a sandbox's agent defaults to (a template's USER), kept for resume.
ALTER TABLE sandboxes ADD COLUMN default_user TEXT NOT NULL DEFAULT '';
