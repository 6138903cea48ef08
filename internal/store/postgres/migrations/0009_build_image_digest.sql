-- The manifest digest of a build's image: any control-plane replica
-- resolves the image a node pulls from the row, not from its own image
-- index ("Images shared by replicas"). '' for older builds. Numbered 0009:
-- 0008 is the pause package.
ALTER TABLE template_builds ADD COLUMN image_digest TEXT NOT NULL DEFAULT '';
