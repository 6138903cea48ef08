CREATE TABLE sandboxes (
  id TEXT PRIMARY KEY,
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
  auto_pause INTEGER NOT NULL DEFAULT 0,
  auto_resume INTEGER NOT NULL DEFAULT 0,
  addr TEXT NOT NULL DEFAULT '',
  api_key_id TEXT NOT NULL DEFAULT '',
  started_at INTEGER NOT NULL,
  end_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  killed_at INTEGER NOT NULL DEFAULT 0,
  kill_reason TEXT NOT NULL DEFAULT ''
);
CREATE INDEX sandboxes_state ON sandboxes(state, started_at);

CREATE TABLE api_keys (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL,
  hash TEXT NOT NULL UNIQUE,
  prefix TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  last_used INTEGER NOT NULL DEFAULT 0
);

CREATE TABLE events (
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  sandbox_id TEXT NOT NULL,
  type TEXT NOT NULL,
  level TEXT NOT NULL,
  message TEXT NOT NULL,
  time INTEGER NOT NULL
);
CREATE INDEX events_sandbox ON events(sandbox_id, time);
