-- Where one shopper stands in a sale's waiting room (reads only).
-- KEYS[1] meta hash   KEYS[2] stock counter   KEYS[3] line   KEYS[4] queue state
-- KEYS[5] admissions open   KEYS[6] admissions ever   KEYS[7] buyers set
-- ARGV[1] user id   ARGV[2] now in ms ('' = the Redis clock)
-- Returns {code, state, position, ahead, expiry ms, waiting, now}:
--   code 0 (then state), 4 not loaded, 6 recovering, 13 no waiting room
--   state 0 not in line, 1 waiting, 2 admitted (expiry), 3 passed (admitted, never
--   bought, expired), 4 bought, 5 sold out (waiting, no unit left)
--   position: 1-based place in the line (0 when none); ahead: people still waiting
--   before this one (-1 before the opening: the early joiners' order is drawn
--   then); waiting: people not yet reached by admission
local meta = redis.call('HMGET', KEYS[1], 'starts_ms', 'run', 'wr')
local now = clock_ms(ARGV[2])
if not meta[1] then
  return {4, 0, 0, 0, 0, 0, now}
end
if not same_run(meta[2]) or redis.call('EXISTS', KEYS[2]) == 0 then
  return {6, 0, 0, 0, 0, 0, now}
end
if (tonumber(meta[3]) or 0) <= 0 then
  return {13, 0, 0, 0, 0, 0, now}
end
local user = ARGV[1]
local place = redis.call('ZSCORE', KEYS[3], user)
local head = redis.call('HGET', KEYS[4], 'head')
local waiting = redis.call('ZCOUNT', KEYS[3], head and ('(' .. head) or '-inf', '+inf')
local position = place and redis.call('ZCOUNT', KEYS[3], '-inf', place) or 0
if redis.call('SISMEMBER', KEYS[7], user) == 1 then
  return {0, 4, position, 0, 0, waiting, now}
end
if redis.call('HEXISTS', KEYS[6], user) == 1 then
  local expiry = tonumber(redis.call('ZSCORE', KEYS[5], user))
  if expiry and expiry > now then
    return {0, 2, position, 0, expiry, waiting, now}
  end
  return {0, 3, position, 0, 0, waiting, now}
end
if not place then
  return {0, 0, 0, 0, 0, waiting, now}
end
if tonumber(redis.call('GET', KEYS[2])) <= 0 then
  return {0, 5, position, 0, 0, waiting, now}
end
if now < tonumber(meta[1]) then
  return {0, 1, position, -1, 0, waiting, now}
end
local ahead = redis.call('ZCOUNT', KEYS[3], head and ('(' .. head) or '-inf', '(' .. place)
return {0, 1, position, ahead, 0, waiting, now}
