-- A remote node's data-plane address (host:port; address stays its gRPC
-- one) and the template images it reports cached, as a JSON list.
ALTER TABLE nodes ADD COLUMN data_address TEXT NOT NULL DEFAULT '';
ALTER TABLE nodes ADD COLUMN templates TEXT NOT NULL DEFAULT '[]';
