-- A model of PostgresStorage's acquisition + release since fcf89f5 (non-reentrant take, RETURNING release): literal parameters.
INSERT INTO x AS cur (lock_key, version, owner, count, fencing, acquired_at, expires_at, holder_host, holder_pid, holder_note) VALUES ('k' || :client_id, 123456789, '\x0707'::bytea, 1,
  CASE WHEN EXISTS (SELECT 1 FROM x WHERE lock_key = 'k' || :client_id) THEN -1
       ELSE COALESCE((SELECT fencing FROM x WHERE lock_key = 'floor' FOR SHARE), 0) + 1 END,
  floor(extract(epoch from statement_timestamp()) * 1000)::bigint, floor(extract(epoch from statement_timestamp()) * 1000)::bigint + 30000, 'host', 1, NULL)
 ON CONFLICT (lock_key) DO UPDATE SET
  version = EXCLUDED.version, count = 1, fencing = cur.fencing + 1, acquired_at = EXCLUDED.acquired_at,
  expires_at = EXCLUDED.expires_at, holder_host = EXCLUDED.holder_host, holder_pid = EXCLUDED.holder_pid,
  holder_note = EXCLUDED.holder_note, waiters = false, owner = EXCLUDED.owner
 WHERE NOT (cur.count > 0 AND cur.expires_at > EXCLUDED.acquired_at)
 RETURNING true, CASE WHEN fencing <> -1 THEN fencing ELSE ('swept ' || fencing)::bigint END, count, expires_at;
UPDATE x SET version = (random()*1e15)::bigint, count = count - 1, expires_at = CASE WHEN count = 1 THEN LEAST(expires_at, floor(extract(epoch from statement_timestamp()) * 1000)::bigint) ELSE expires_at END WHERE lock_key = 'k' || :client_id AND owner = '\x0707'::bytea AND count > 0 RETURNING count, CASE WHEN count = 0 AND waiters THEN (SELECT 1 FROM pg_notify('chan', 'k')) ELSE 0 END, set_config('synchronous_commit', 'off', true);
