-- Snapshots: a snapshot is also a template (its row in templates, with a
-- ready build whose rootfs is the snapshot's layer over the source's
-- layers). This table keeps what the template row cannot: the source, the
-- kind, the memory image, the volume mounts and env to restore. A deleted
-- snapshot's row stays as a tombstone (deleted_at set) until no sandbox
-- runs from its layer; the snapshot reconciler then removes its files and
-- the row.
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
  size_bytes INTEGER NOT NULL DEFAULT 0,
  volumes TEXT NOT NULL DEFAULT '[]',
  env_vars TEXT NOT NULL DEFAULT '{}',
  default_user TEXT NOT NULL DEFAULT '',
  agent_token TEXT NOT NULL DEFAULT '',
  internal INTEGER NOT NULL DEFAULT 0,
  created_at INTEGER NOT NULL,
  deleted_at INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX snapshots_team ON snapshots(team_id, deleted_at, created_at);
CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id);
CREATE INDEX snapshots_source_template ON snapshots(source_template_id);

-- The layers a sandbox booted on (a later build of its template must not
-- change what its snapshots stack on), and whether its timeout pause
-- keeps memory (e2b's autoPauseMemory).
ALTER TABLE sandboxes ADD COLUMN layers TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN pause_memory INTEGER NOT NULL DEFAULT 1;
