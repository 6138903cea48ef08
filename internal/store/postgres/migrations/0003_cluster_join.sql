-- The cluster CA (one row at most: id is always 1) and node join tokens.
-- The CA key is sealed by internal/secret; a token keeps only its secret's
-- SHA-256. used_at is 0 while the token is unused.
CREATE TABLE cluster_ca (
  id INTEGER PRIMARY KEY CHECK (id = 1),
  cert_pem BYTEA NOT NULL,
  key_sealed BYTEA NOT NULL,
  created_at BIGINT NOT NULL
);
CREATE TABLE join_tokens (
  id TEXT PRIMARY KEY,
  secret_hash TEXT NOT NULL,
  labels TEXT NOT NULL DEFAULT '{}',
  created_at BIGINT NOT NULL,
  expires_at BIGINT NOT NULL,
  used_at BIGINT NOT NULL DEFAULT 0,
  used_by TEXT NOT NULL DEFAULT ''
);
