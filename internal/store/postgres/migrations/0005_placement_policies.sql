-- Placement policies: CEL filter/score text per team or template, at most
-- one per (scope, target). The control plane compiles them; the store
-- keeps the text. Numbered 0005: 0004 is the node data address.
CREATE TABLE placement_policies (
  scope TEXT NOT NULL CHECK (scope IN ('team', 'template')),
  target TEXT NOT NULL,
  filter_expr TEXT NOT NULL DEFAULT '',
  score_expr TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  PRIMARY KEY (scope, target)
);
