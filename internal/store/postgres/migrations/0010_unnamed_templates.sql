-- A template may have no name: CubeAPI's create-from-image makes unnamed
-- templates, and an alias moves between templates. Names stay unique per
-- team through template_names; the primary name is unique only when set.
ALTER TABLE templates DROP CONSTRAINT templates_team_id_primary_name_key;
CREATE UNIQUE INDEX templates_primary_name ON templates(team_id, primary_name) WHERE primary_name <> '';
