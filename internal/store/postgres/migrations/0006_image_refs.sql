-- What a sandbox boots from as references a node resolves itself, beside
-- the host paths in layers: the image (a built-in's name, or
-- repository@sha256:… in the control plane's registry) and the snapshot
-- chain by ID, top-most first (joined with ':'). A snapshot keeps the same
-- pair, its own ID first. A node that pulls images gets these instead of
-- paths. A snapshot's package in the snapshot store (cross-node restore) is
-- a JSON array of {part, digest, size}. Numbered 0006: 0005 is placement policies.
ALTER TABLE sandboxes ADD COLUMN image TEXT NOT NULL DEFAULT '';
ALTER TABLE sandboxes ADD COLUMN snapshot_layers TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN image TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN snapshot_layers TEXT NOT NULL DEFAULT '';
ALTER TABLE snapshots ADD COLUMN package TEXT NOT NULL DEFAULT '[]';
