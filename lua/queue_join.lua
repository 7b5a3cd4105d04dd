-- A shopper joins a sale's waiting room (see src/sale/queue.rs): one place per
-- account, the same answer however often it joins.
-- KEYS[1] meta hash (starts_ms, ends_ms, closed, run, wr = admissions a second,
-- q_opens_ms)   KEYS[2] stock counter   KEYS[3] line (sorted set user -> place)
-- KEYS[4] queue state hash (seq, joins, ...)   KEYS[5] joins stream (copied to
-- Postgres by the admitter)
-- ARGV[1] user id   ARGV[2] the place of an early joiner: a random integer in
-- [1, 2^52) drawn by the server   ARGV[3] now in ms ('' = the Redis clock)
-- A place is a score: everyone who joins before the opening holds a random one
-- below 2^52 (so the line's early part is in random order, whenever they came);
-- a later joiner holds 2^52 + n, n counting the late joins (arrival order).
-- Returns {code, value, place (as text, '' when none)}:
--   0 in line (value 1: a new place, 0: the place held already)
--   2 the line does not open yet (value = ms until it does)   3 ended or closed
--   4 not loaded   5 sold out   6 recovering   13 the sale has no waiting room
local meta = redis.call('HMGET', KEYS[1], 'starts_ms', 'ends_ms', 'closed', 'run', 'wr', 'q_opens_ms')
if not meta[1] then
  return {4, 0, ''}
end
if not same_run(meta[4]) or redis.call('EXISTS', KEYS[2]) == 0 then
  return {6, 0, ''}
end
if (tonumber(meta[5]) or 0) <= 0 then
  return {13, 0, ''}
end
local held = redis.call('ZSCORE', KEYS[3], ARGV[1])
if held then
  return {0, 0, held}
end
local now = clock_ms(ARGV[3])
if meta[3] == '1' or now >= tonumber(meta[2]) then
  return {3, 0, ''}
end
local opens = math.min(tonumber(meta[6]) or tonumber(meta[1]), tonumber(meta[1]))
if now < opens then
  return {2, opens - now, ''}
end
if tonumber(redis.call('GET', KEYS[2])) <= 0 then
  return {5, 0, ''}
end
local place
if now < tonumber(meta[1]) then
  place = ARGV[2]
else
  place = string.format('%.0f', 4503599627370496 + redis.call('HINCRBY', KEYS[4], 'seq', 1))
end
redis.call('ZADD', KEYS[3], place, ARGV[1])
redis.call('HINCRBY', KEYS[4], 'joins', 1)
redis.call('XADD', KEYS[5], '*', 'u', ARGV[1], 'p', place, 't', now)
return {0, 1, place}
