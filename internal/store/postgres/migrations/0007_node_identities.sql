-- A node ID's join state. joined: a join token was redeemed for the ID and
-- it has not been forgotten since, so no second token can take it (even
-- before its first register). revoked_at: the last `cubicle node forget`
-- of the ID (0: never); certificates for the ID issued before it are
-- refused. Registered nodes joined before this table existed count as
-- joined.
CREATE TABLE node_identities (
  node_id TEXT PRIMARY KEY,
  joined BOOLEAN NOT NULL DEFAULT false,
  revoked_at BIGINT NOT NULL DEFAULT 0
);
INSERT INTO node_identities(node_id, joined, revoked_at) SELECT id, true, 0 FROM nodes;
