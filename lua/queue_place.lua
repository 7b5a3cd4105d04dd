-- A shopper's place in a sale's waiting room (see src/sale/queue.rs): joining it
-- (ARGV[4] = '1': one place per account, the same answer however often it joins),
-- and where the shopper stands, in one call.
-- KEYS[1] meta hash (starts_ms, ends_ms, closed, run, wr = admissions a second,
-- q_opens_ms)   KEYS[2] stock counter   KEYS[3] line (sorted set user -> place)
-- KEYS[4] queue state hash (head, seq, joins, ...)   KEYS[5] joins stream (copied
-- to Postgres by the admitter)   KEYS[6] admissions open (user -> expiry ms)
-- KEYS[7] admissions ever (user -> expiry ms)   KEYS[8] buyers set
-- ARGV[1] user id   ARGV[2] the place of an early joiner: a random integer in
-- [1, 2^52) drawn by the server   ARGV[3] now in ms ('' = the Redis clock)
-- ARGV[4] '1' to join, '0' only to read
-- A place is a score: everyone who joins before the opening holds a random one
-- below 2^52 (so the line's early part is in random order, whenever they came);
-- a later joiner holds 2^52 + n, n counting the late joins (arrival order).
-- Returns {code, value, state, position, ahead, expiry ms, waiting, now ms,
-- starts_ms, admissions a second}; code:
--   0 done (value 1: this call took a new place, else 0), then the standing:
--     state 0 not in line, 1 waiting, 2 admitted (until expiry), 3 passed
--     (admitted, never bought, expired), 4 bought, 5 sold out (waiting, no unit
--     left); position: 1-based place (0: none); ahead: people still waiting before
--     this one (-1 before the opening: the early order is drawn then); waiting:
--     people not yet reached by admission
--   2 the line does not open yet (value = ms until it does)   3 ended or closed
--   4 not loaded   5 sold out   6 recovering   13 the sale has no waiting room
local meta = redis.call('HMGET', KEYS[1], 'starts_ms', 'ends_ms', 'closed', 'run', 'wr', 'q_opens_ms')
local now = clock_ms(ARGV[3])
local function refused(code, value)
  return {code, value, 0, 0, 0, 0, 0, now, 0, 0}
end
if not meta[1] then
  return refused(4, 0)
end
if not same_run(meta[4]) or redis.call('EXISTS', KEYS[2]) == 0 then
  return refused(6, 0)
end
local rate = tonumber(meta[5]) or 0
if rate <= 0 then
  return refused(13, 0)
end
local starts = tonumber(meta[1])
local user = ARGV[1]
local place = redis.call('ZSCORE', KEYS[3], user)
local new = 0
if not place and ARGV[4] == '1' then
  if meta[3] == '1' or now >= tonumber(meta[2]) then
    return refused(3, 0)
  end
  local opens = math.min(tonumber(meta[6]) or starts, starts)
  if now < opens then
    return refused(2, opens - now)
  end
  if tonumber(redis.call('GET', KEYS[2])) <= 0 then
    return refused(5, 0)
  end
  if now < starts then
    place = ARGV[2]
  else
    place = string.format('%.0f', 4503599627370496 + redis.call('HINCRBY', KEYS[4], 'seq', 1))
  end
  redis.call('ZADD', KEYS[3], place, user)
  redis.call('HINCRBY', KEYS[4], 'joins', 1)
  redis.call('XADD', KEYS[5], '*', 'u', user, 'p', place, 't', now)
  new = 1
end

local function standing(state, position, ahead, expiry, waiting)
  return {0, new, state, position, ahead, expiry, waiting, now, starts, rate}
end
local head = redis.call('HGET', KEYS[4], 'head')
local after_head = head and ('(' .. head) or '-inf'
local waiting = redis.call('ZCOUNT', KEYS[3], after_head, '+inf')
local position = place and redis.call('ZCOUNT', KEYS[3], '-inf', place) or 0
if redis.call('SISMEMBER', KEYS[8], user) == 1 then
  return standing(4, position, 0, 0, waiting)
end
if redis.call('HEXISTS', KEYS[7], user) == 1 then
  local expiry = tonumber(redis.call('ZSCORE', KEYS[6], user))
  if expiry and expiry > now then
    return standing(2, position, 0, expiry, waiting)
  end
  return standing(3, position, 0, 0, waiting)
end
if not place then
  return standing(0, 0, 0, 0, waiting)
end
if tonumber(redis.call('GET', KEYS[2])) <= 0 then
  return standing(5, position, 0, 0, waiting)
end
if now < starts then
  return standing(1, position, -1, 0, waiting)
end
return standing(1, position, redis.call('ZCOUNT', KEYS[3], after_head, '(' .. place), 0, waiting)
