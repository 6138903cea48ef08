-- Accelerators: what a sandbox asked for (JSON array of requests) and a
-- template's compatibility contract (JSON object); '' means none.
ALTER TABLE sandboxes ADD COLUMN accelerators TEXT NOT NULL DEFAULT '';
ALTER TABLE templates ADD COLUMN accelerators TEXT NOT NULL DEFAULT '';
