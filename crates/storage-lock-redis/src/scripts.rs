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

/// The acquire rule, shared by [`acquire`], [`acquire_many`] and [`acquire_any`]. ARGV = version, owner, lease
/// ms, reentrant, has_holder, host, pid, has_note, note.
const ACQUIRE_RULE: &str = r#"
-- The record at `key` and what `acquire` would do with it: 'take', 'reenter' or 'busy'.
local function look(key, now)
  local r = redis.call('HMGET', key, 'o', 'c', 'f', 'e', 'hh', 'hn', 'w')
  if r[2] and tonumber(r[2]) > 0 and tonumber(r[4]) > now then
    if ARGV[4] == '1' and r[1] == ARGV[2] then return 'reenter', r end
    return 'busy', r
  end
  return 'take', r
end
-- The busy answer for `key` (held, as `look` found in `r`): marks the record (field `w`) so
-- that its release publishes. `{0, expires_at, now, host, pid, note}`.
local function busy(key, r, now)
  if not r[7] then redis.call('HSET', key, 'w', 1) end
  local h = redis.call('HMGET', key, 'hh', 'hp', 'hn')
  return {0, tonumber(r[4]), now, h[1] or false, h[2] or false, h[3] or false}
end
-- The fencing token `grant` gives `key` (as `look` decided on `r`): the record's for a
-- reentry, one above it for a new hold, one above the floor (`floor()`, read when first
-- needed) for a fresh key. Errors on a bad record happen here, before anything is written.
local function token(how, r, floor)
  local f = tonumber(r[3])
  if how == 'reenter' then return f end
  if r[2] then
    if not f then return redis.error_reply('a lock record without a fencing token') end
    return f + 1
  end
  return floor() + 1
end
-- A reader of the floor record at `floor_key` that reads it once.
local function floor_reader(floor_key)
  local floor
  return function()
    if not floor then floor = tonumber(redis.call('HGET', floor_key, 'f') or '0') end
    return floor
  end
end
-- Takes or re-enters `key` (as `look` decided on `r`) with the token `fencing`; only writes.
-- Returns `{fencing, count, expires_at}`.
local function grant(key, how, r, fencing, now)
  local exp = now + tonumber(ARGV[3])
  if how == 'reenter' then
    local count, e = tonumber(r[2]) + 1, tonumber(r[4])
    if e > exp then exp = e end
    redis.call('HSET', key, 'v', ARGV[1], 'c', count, 'e', exp)
    return {fencing, count, exp}
  end
  -- One HSET for the whole record; drop holder fields this request does not set (if present).
  if ARGV[5] == '1' and ARGV[8] == '1' then
    redis.call('HSET', key, 'v', ARGV[1], 'o', ARGV[2], 'c', 1, 'f', fencing, 'a', now, 'e', exp,
      'hh', ARGV[6], 'hp', ARGV[7], 'hn', ARGV[9])
  elseif ARGV[5] == '1' then
    redis.call('HSET', key, 'v', ARGV[1], 'o', ARGV[2], 'c', 1, 'f', fencing, 'a', now, 'e', exp,
      'hh', ARGV[6], 'hp', ARGV[7])
    if r[6] then redis.call('HDEL', key, 'hn') end
  else
    redis.call('HSET', key, 'v', ARGV[1], 'o', ARGV[2], 'c', 1, 'f', fencing, 'a', now, 'e', exp)
    if r[5] then redis.call('HDEL', key, 'hh', 'hp', 'hn') end
  end
  if r[7] then redis.call('HDEL', key, 'w') end
  return {fencing, 1, exp}
end
"#;

/// KEYS = record, floor record; ARGV as [`ACQUIRE_RULE`]. Returns `{1, fencing, count,
/// expires_at}` when acquired, else `{0, expires_at, now, host, pid, note}` (the holder's). A
/// busy answer marks the record (field `w`): only the release of a marked record publishes (see
/// [`release`]). A new hold starts unmarked.
pub(crate) fn acquire() -> String {
    format!(
        "{PRELUDE}{ACQUIRE_RULE}
local now = now_ms()
local how, r = look(KEYS[1], now)
if how == 'busy' then return busy(KEYS[1], r, now) end
local f = token(how, r, floor_reader(KEYS[2]))
if type(f) == 'table' then return f end
local g = grant(KEYS[1], how, r, f, now)
return {{1, g[1], g[2], g[3]}}"
    )
}

/// KEYS = the records (distinct), then the floor record; ARGV as [`ACQUIRE_RULE`]. All or
/// nothing, on one `TIME`: every record is looked at, and every token worked out, before any
/// is written (a script that fails half-way keeps what it wrote). Returns `{1,
/// fencing, count, expires_at}` followed by the same three for each further key when all are
/// acquired, else `{0, position (1-based), expires_at, now, host, pid, note}` for the first
/// busy key, which is marked as [`acquire`] marks it; nothing else is written then.
pub(crate) fn acquire_many() -> String {
    format!(
        "{PRELUDE}{ACQUIRE_RULE}
local now = now_ms()
local n = #KEYS - 1
local floor = floor_reader(KEYS[n + 1])
local hows, rs, fs = {{}}, {{}}, {{}}
for i = 1, n do
  local how, r = look(KEYS[i], now)
  if how == 'busy' then
    local b = busy(KEYS[i], r, now)
    return {{0, i, b[2], b[3], b[4], b[5], b[6]}}
  end
  local f = token(how, r, floor)
  if type(f) == 'table' then return f end
  hows[i], rs[i], fs[i] = how, r, f
end
local out = {{1}}
for i = 1, n do
  local g = grant(KEYS[i], hows[i], rs[i], fs[i], now)
  out[#out + 1] = g[1]
  out[#out + 1] = g[2]
  out[#out + 1] = g[3]
end
return out"
    )
}

/// KEYS = the records (distinct), the floor record, then the gate record if ARGV[11] is '1';
/// ARGV as [`ACQUIRE_RULE`], then `need` and whether there is a gate. Takes the first `need`
/// free keys, or none, on one `TIME`, and only while the gate has no holder (count 0 or no
/// record): the gate and every record are looked at (until `need` free ones are found), and
/// the tokens of the ones to take worked out, before any is written. Returns `{1, the gate's
/// token (the floor's when it has no record; 0 without a gate), then position (1-based),
/// fencing, count, expires_at for each key taken}`,
/// `{2}` when the gate is held, else `{0, now, then position, expires_at for every held key}`
/// (none is marked: a waiter marks the slot it then waits on, as [`acquire`] does).
pub(crate) fn acquire_any() -> String {
    format!(
        "{PRELUDE}{ACQUIRE_RULE}
local now = now_ms()
local gated = ARGV[11] == '1'
local n = #KEYS - 1
if gated then n = n - 1 end
local need = tonumber(ARGV[10])
local floor = floor_reader(KEYS[n + 1])
local gate = 0
if gated then
  local g = redis.call('HMGET', KEYS[n + 2], 'c', 'f')
  if g[1] and tonumber(g[1]) > 0 then return {{2}} end
  -- No record (never held, or swept): the floor, at least any token it ever had.
  if g[2] then gate = tonumber(g[2]) else gate = floor() end
end
local take, held = {{}}, {{0, now}}
for i = 1, n do
  if #take == need then break end
  local how, r = look(KEYS[i], now)
  if how == 'busy' then
    held[#held + 1] = i
    held[#held + 1] = tonumber(r[4])
  else
    local f = token(how, r, floor)
    if type(f) == 'table' then return f end
    take[#take + 1] = {{i, how, r, f}}
  end
end
if #take < need then return held end
local out = {{1, gate}}
for _, t in ipairs(take) do
  local g = grant(KEYS[t[1]], t[2], t[3], t[4], now)
  out[#out + 1] = t[1]
  out[#out + 1] = g[1]
  out[#out + 1] = g[2]
  out[#out + 1] = g[3]
end
return out"
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
