-- Volumes and their attachments. The cluster-wide reference count of a volume
-- is the number of attachment rows; they are written in the same transaction
-- as the sandbox row (before any node work) and removed only once the node
-- confirmed the detach, so the delete guard can never see a stale zero.
CREATE TABLE volumes (
  id TEXT PRIMARY KEY,
  name TEXT NOT NULL UNIQUE,
  driver TEXT NOT NULL,
  state TEXT NOT NULL,
  token TEXT NOT NULL DEFAULT '',
  private_data TEXT NOT NULL DEFAULT '',
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
);

CREATE TABLE volume_attachments (
  volume_id TEXT NOT NULL REFERENCES volumes(id),
  sandbox_id TEXT NOT NULL,
  node TEXT NOT NULL,
  path TEXT NOT NULL,
  read_only INTEGER NOT NULL DEFAULT 0,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (volume_id, sandbox_id)
);
CREATE INDEX volume_attachments_sandbox ON volume_attachments(sandbox_id);

ALTER TABLE sandboxes ADD COLUMN volumes TEXT NOT NULL DEFAULT '[]';
ALTER TABLE events ADD COLUMN volume_id TEXT NOT NULL DEFAULT '';
CREATE INDEX events_volume ON events(volume_id, time);
