-- Secrets: only the current version's sealed value is kept (AES-256-GCM
-- by internal/secret, the key outside this database); version counts
-- updates. Names are unique per team.
CREATE TABLE secrets (
  id TEXT PRIMARY KEY,
  team_id TEXT NOT NULL,
  name TEXT NOT NULL,
  version INTEGER NOT NULL,
  metadata TEXT NOT NULL DEFAULT '{}',
  sealed BLOB NOT NULL,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  UNIQUE(team_id, name)
);
CREATE INDEX secrets_team ON secrets(team_id, created_at, id);
