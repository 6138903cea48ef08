-- The package of a paused sandbox's current pause in the snapshot store
-- (cross-node resume): JSON {snapshotID, filesOnly}, '' for none. It names
-- an internal snapshot the sandbox owns. Numbered 0008: 0007 is node identities.
ALTER TABLE sandboxes ADD COLUMN pause_package TEXT NOT NULL DEFAULT '';
