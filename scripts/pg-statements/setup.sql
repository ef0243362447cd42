-- The tables the models run on (the storage's schema; x for the engine, xb for the durable row).
DROP TABLE IF EXISTS x; DROP TABLE IF EXISTS xb; DROP SEQUENCE IF EXISTS x_version;
CREATE SEQUENCE x_version;
CREATE TABLE x (lock_key TEXT COLLATE "C" PRIMARY KEY, version BIGINT NOT NULL, owner BYTEA NOT NULL, count BIGINT NOT NULL, fencing BIGINT NOT NULL, acquired_at BIGINT NOT NULL, expires_at BIGINT NOT NULL, holder_host TEXT, holder_pid BIGINT, holder_note TEXT, waiters BOOLEAN NOT NULL DEFAULT false);
CREATE TABLE xb (LIKE x INCLUDING ALL);
INSERT INTO x (lock_key, version, owner, count, fencing, acquired_at, expires_at) VALUES ('floor', 0, '\x00'::bytea, 0,0,0,0);
