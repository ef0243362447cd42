//! The Lua scripts: one per operation, each atomic on the server and judged by Redis `TIME`.
//!
//! A record is a hash with fields `v` (version), `o` (owner, 32 hex digits), `c` (count),
//! `f` (fencing), `a` (acquired at, ms), `e` (expires at, ms) and, if known, `hh`/`hp`/`hn`
//! (holder host, pid, note). Records never get a TTL: a tombstone keeps its fencing token until
//! a sweep deletes it (after raising the floor), so tokens survive release and expiry.
//!
//! Lua numbers are doubles: a token is exact up to 2^53, `2^53 + 1` rounds back to `2^53` (a
//! token handed out twice) and tokens past ~10^17 are written in exponent form. The storage
//! therefore declares a fencing bound of 2^53 − 1 (`Capabilities::fencing_bound`), and the
//! engine refuses grants 2^32 below it.

/// Shared helpers, prepended to every script that needs them.
const PRELUDE: &str = r#"
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
-- Replaces the record at `key` with fields from ARGV starting at `i`:
-- version, owner, count, fencing, acquired_at, expires_at, has_holder, host, pid, has_note, note
local function write(key, i)
  redis.call('DEL', key)
  redis.call('HSET', key, 'v', ARGV[i], 'o', ARGV[i + 1], 'c', ARGV[i + 2], 'f', ARGV[i + 3],
    'a', ARGV[i + 4], 'e', ARGV[i + 5])
  if ARGV[i + 6] == '1' then
    redis.call('HSET', key, 'hh', ARGV[i + 7], 'hp', ARGV[i + 8])
    if ARGV[i + 9] == '1' then redis.call('HSET', key, 'hn', ARGV[i + 10]) end
  end
end
"#;

/// KEYS[1]; ARGV = record fields (see `write`). Returns 1 if created, 0 if the key exists.
pub(crate) fn create() -> String {
    format!(
        "{PRELUDE}
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
write(KEYS[1], 1)
return 1"
    )
}

/// KEYS[1]; ARGV[1] = expected version, then record fields. Returns 1 if replaced, else 0.
pub(crate) fn update() -> String {
    format!(
        "{PRELUDE}
if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
write(KEYS[1], 2)
return 1"
    )
}

/// KEYS[1]; ARGV[1] = expected version. Returns 1 if deleted, else 0.
pub(crate) const DELETE: &str = "
if redis.call('HGET', KEYS[1], 'v') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1";

/// KEYS = record, floor record; ARGV = version, owner, lease ms, reentrant, has_holder, host,
/// pid, has_note, note. Returns `{1, fencing, count, expires_at}` when acquired, else
/// `{0, expires_at, now, host, pid, note}` (the holder's). A busy answer marks the record
/// (field `w`): only the release of a marked record publishes (see [`release`]). A new hold
/// starts unmarked.
pub(crate) fn acquire() -> String {
    format!(
        "{PRELUDE}
local now = now_ms()
local exp = now + tonumber(ARGV[3])
local r = redis.call('HMGET', KEYS[1], 'o', 'c', 'f', 'e', 'hh', 'hn', 'w')
local fencing
if r[2] then
  local count, e = tonumber(r[2]), tonumber(r[4])
  fencing = tonumber(r[3])
  if count > 0 and e > now then
    if ARGV[4] == '1' and r[1] == ARGV[2] then
      count = count + 1
      if e > exp then exp = e end
      redis.call('HSET', KEYS[1], 'v', ARGV[1], 'c', count, 'e', exp)
      return {{1, fencing, count, exp}}
    end
    if not r[7] then redis.call('HSET', KEYS[1], 'w', 1) end
    local h = redis.call('HMGET', KEYS[1], 'hh', 'hp', 'hn')
    return {{0, e, now, h[1] or false, h[2] or false, h[3] or false}}
  end
  fencing = fencing + 1
else
  fencing = tonumber(redis.call('HGET', KEYS[2], 'f') or '0') + 1
end
-- One HSET for the whole record; drop holder fields this request does not set (if present).
if ARGV[5] == '1' and ARGV[8] == '1' then
  redis.call('HSET', KEYS[1], 'v', ARGV[1], 'o', ARGV[2], 'c', 1, 'f', fencing, 'a', now, 'e', exp,
    'hh', ARGV[6], 'hp', ARGV[7], 'hn', ARGV[9])
elseif ARGV[5] == '1' then
  redis.call('HSET', KEYS[1], 'v', ARGV[1], 'o', ARGV[2], 'c', 1, 'f', fencing, 'a', now, 'e', exp,
    'hh', ARGV[6], 'hp', ARGV[7])
  if r[6] then redis.call('HDEL', KEYS[1], 'hn') end
else
  redis.call('HSET', KEYS[1], 'v', ARGV[1], 'o', ARGV[2], 'c', 1, 'f', fencing, 'a', now, 'e', exp)
  if r[5] then redis.call('HDEL', KEYS[1], 'hh', 'hp', 'hn') end
end
if r[7] then redis.call('HDEL', KEYS[1], 'w') end
return {{1, fencing, 1, exp}}"
    )
}

/// KEYS[1]; ARGV = version, owner, lease ms. Returns the new expiry, or -1 if not held.
pub(crate) fn renew() -> String {
    format!(
        "{PRELUDE}
local now = now_ms()
local r = redis.call('HMGET', KEYS[1], 'o', 'c', 'e')
if r[1] == ARGV[2] and tonumber(r[2] or '0') > 0 and tonumber(r[3]) > now then
  local exp = now + tonumber(ARGV[3])
  redis.call('HSET', KEYS[1], 'v', ARGV[1], 'e', exp)
  return exp
end
return -1"
    )
}

/// KEYS = the records; ARGV = version, then owner and lease ms for each key. Returns one entry
/// per key: its new expiry, or -1 if not held (the rule of [`renew`], on one `TIME`).
pub(crate) fn renew_many() -> String {
    format!(
        "{PRELUDE}
local now = now_ms()
local out = {{}}
for i, key in ipairs(KEYS) do
  local owner, lease = ARGV[2 * i], tonumber(ARGV[2 * i + 1])
  local r = redis.call('HMGET', key, 'o', 'c', 'e')
  if r[1] == owner and tonumber(r[2] or '0') > 0 and tonumber(r[3]) > now then
    local exp = now + lease
    redis.call('HSET', key, 'v', ARGV[1], 'e', exp)
    out[i] = exp
  else
    out[i] = -1
  end
end
return out"
    )
}

/// KEYS[1]; ARGV = version, owner, channel, key. Returns `{levels left, fencing token}` (the
/// token as stored, a string: no trip through a double), or `{-1, '0'}` if not held by the
/// owner. When the lock becomes free and a busy acquisition marked the record (`w`), it
/// publishes the key on the channel and clears the mark; an unmarked release publishes nothing
/// (nobody waits for it: a waiter arms its subscription *before* the attempt that marks).
pub(crate) fn release() -> String {
    format!(
        "{PRELUDE}
local r = redis.call('HMGET', KEYS[1], 'o', 'c', 'e', 'w', 'f')
if r[1] ~= ARGV[2] or tonumber(r[2] or '0') <= 0 then return {{-1, '0'}} end
local c = tonumber(r[2]) - 1
if c == 0 then
  local now, e = now_ms(), tonumber(r[3])
  if now < e then e = now end
  redis.call('HSET', KEYS[1], 'v', ARGV[1], 'c', 0, 'e', e)
  if r[4] then
    redis.call('HDEL', KEYS[1], 'w')
    redis.call('PUBLISH', ARGV[3], ARGV[4])
  end
else
  redis.call('HSET', KEYS[1], 'v', ARGV[1], 'c', c)
end
return {{c, r[5] or '0'}}"
    )
}
