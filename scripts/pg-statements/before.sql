-- A model of PostgresStorage's acquisition + release before the sixth session (634463b): literal parameters, key k<client>.
WITH ins AS (
 INSERT INTO x AS cur (lock_key, version, owner, count, fencing, acquired_at, expires_at, holder_host, holder_pid, holder_note) VALUES ('k' || :client_id, nextval('x_version'), '\x0707'::bytea, 1,
  CASE WHEN EXISTS (SELECT 1 FROM x WHERE lock_key = 'k' || :client_id) THEN -1
       ELSE COALESCE((SELECT fencing FROM x WHERE lock_key = 'floor' FOR SHARE), 0) + 1 END,
  floor(extract(epoch from statement_timestamp()) * 1000)::bigint, floor(extract(epoch from statement_timestamp()) * 1000)::bigint + 30000, 'host', 1, NULL)
 ON CONFLICT (lock_key) DO UPDATE SET
  version = EXCLUDED.version,
  count = CASE WHEN (cur.count > 0 AND cur.expires_at > floor(extract(epoch from statement_timestamp()) * 1000)::bigint) THEN cur.count + 1 ELSE 1 END,
  fencing = CASE WHEN (cur.count > 0 AND cur.expires_at > floor(extract(epoch from statement_timestamp()) * 1000)::bigint) THEN cur.fencing ELSE cur.fencing + 1 END,
  acquired_at = CASE WHEN (cur.count > 0 AND cur.expires_at > floor(extract(epoch from statement_timestamp()) * 1000)::bigint) THEN cur.acquired_at ELSE EXCLUDED.acquired_at END,
  expires_at = CASE WHEN (cur.count > 0 AND cur.expires_at > floor(extract(epoch from statement_timestamp()) * 1000)::bigint) THEN GREATEST(cur.expires_at, EXCLUDED.expires_at) ELSE EXCLUDED.expires_at END,
  holder_host = CASE WHEN (cur.count > 0 AND cur.expires_at > floor(extract(epoch from statement_timestamp()) * 1000)::bigint) THEN cur.holder_host ELSE EXCLUDED.holder_host END,
  holder_pid = CASE WHEN (cur.count > 0 AND cur.expires_at > floor(extract(epoch from statement_timestamp()) * 1000)::bigint) THEN cur.holder_pid ELSE EXCLUDED.holder_pid END,
  holder_note = CASE WHEN (cur.count > 0 AND cur.expires_at > floor(extract(epoch from statement_timestamp()) * 1000)::bigint) THEN cur.holder_note ELSE EXCLUDED.holder_note END,
  waiters = CASE WHEN (cur.count > 0 AND cur.expires_at > floor(extract(epoch from statement_timestamp()) * 1000)::bigint) THEN cur.waiters ELSE false END,
  owner = EXCLUDED.owner
 WHERE NOT (cur.count > 0 AND cur.expires_at > floor(extract(epoch from statement_timestamp()) * 1000)::bigint) OR (false AND cur.owner = EXCLUDED.owner)
 RETURNING fencing, count, expires_at
),
flag AS (
 UPDATE x SET waiters = true WHERE lock_key = 'k' || :client_id AND NOT waiters AND count > 0 AND expires_at > floor(extract(epoch from statement_timestamp()) * 1000)::bigint AND NOT EXISTS (SELECT 1 FROM ins) RETURNING 1
)
SELECT true AS acquired, CASE WHEN fencing <> -1 THEN fencing ELSE ('swept ' || fencing)::bigint END, count, expires_at, NULL::text, NULL::bigint, NULL::text, floor(extract(epoch from statement_timestamp()) * 1000)::bigint FROM ins
UNION ALL
SELECT false, fencing, count, CASE WHEN waiters OR EXISTS (SELECT 1 FROM flag) THEN expires_at ELSE floor(extract(epoch from statement_timestamp()) * 1000)::bigint END, holder_host, holder_pid, holder_note, floor(extract(epoch from statement_timestamp()) * 1000)::bigint FROM x WHERE lock_key = 'k' || :client_id AND NOT EXISTS (SELECT 1 FROM ins);
WITH upd AS (UPDATE x SET version = (random()*1e15)::bigint, count = count - 1, expires_at = CASE WHEN count = 1 THEN LEAST(expires_at, floor(extract(epoch from statement_timestamp()) * 1000)::bigint) ELSE expires_at END WHERE lock_key = 'k' || :client_id AND owner = '\x0707'::bytea AND count > 0 RETURNING count, waiters) SELECT count, CASE WHEN count = 0 AND waiters THEN (SELECT 1 FROM pg_notify('chan', 'k')) ELSE 0 END, set_config('synchronous_commit', 'off', true) FROM upd;
