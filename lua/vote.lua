-- Decide one vote atomically.
-- KEYS[1] meta hash (opens_ms, closes_ms, closed, run)   KEYS[2] options set
-- KEYS[3] voters hash (user id -> option id)   KEYS[4] tally hash (option id -> count)
-- KEYS[5] votes stream
-- ARGV[1] user id   ARGV[2] option id   ARGV[3] poll id
-- Returns {code, value}:
--   0 accepted (value = the option's new count)   1 already voted   2 not open yet
--   (value = ms to opening)   3 closed   4 not loaded (this Redis has no such poll)
--   5 unknown option   6 recovering (state not trusted by this Redis run)
local meta = redis.call('HMGET', KEYS[1], 'opens_ms', 'closes_ms', 'closed', 'run')
if not meta[1] then
  return {4, 0}
end
if not same_run(meta[4]) then
  return {6, 0}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if meta[3] == '1' or now >= tonumber(meta[2]) then
  return {3, 0}
end
local opens = tonumber(meta[1])
if now < opens then
  return {2, opens - now}
end
if redis.call('SISMEMBER', KEYS[2], ARGV[2]) == 0 then
  return {5, 0}
end
if redis.call('HSETNX', KEYS[3], ARGV[1], ARGV[2]) == 0 then
  return {1, 0}
end
local count = redis.call('HINCRBY', KEYS[4], ARGV[2], 1)
redis.call('XADD', KEYS[5], '*', 'poll_id', ARGV[3], 'user_id', ARGV[1], 'option_id', ARGV[2], 'at_ms', now)
return {0, count}
