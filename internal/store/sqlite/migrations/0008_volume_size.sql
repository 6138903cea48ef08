-- Volumes get a size, enforced by their driver (the local plugin's sparse
-- images); 0 for volumes made before sizes existed (unsized directories).
-- Teams get a byte quota over their volumes' sizes.
ALTER TABLE volumes ADD COLUMN size_mb INTEGER NOT NULL DEFAULT 0;
ALTER TABLE teams ADD COLUMN max_volume_mb INTEGER NOT NULL DEFAULT 0;
