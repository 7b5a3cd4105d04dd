-- Decide one purchase atomically.
-- KEYS[1] meta hash (starts_ms, ends_ms, closed)   KEYS[2] stock counter
-- KEYS[3] buyers set   KEYS[4] orders stream   KEYS[5] pending hash (order id -> user id)
-- ARGV[1] user id   ARGV[2] order id   ARGV[3] sale id
-- Returns {code, value}:
--   0 accepted (value = units left)   1 already bought   2 not started (value = ms to start)
--   3 ended or closed   4 unknown sale   5 sold out
local meta = redis.call('HMGET', KEYS[1], 'starts_ms', 'ends_ms', 'closed')
if not meta[1] then
  return {4, 0}
end
-- The Redis server clock decides, so app servers with skewed clocks cannot disagree.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if meta[3] == '1' or now >= tonumber(meta[2]) then
  return {3, 0}
end
local starts = tonumber(meta[1])
if now < starts then
  return {2, starts - now}
end
if redis.call('SISMEMBER', KEYS[3], ARGV[1]) == 1 then
  return {1, 0}
end
local stock = tonumber(redis.call('GET', KEYS[2]) or '0')
if stock <= 0 then
  return {5, 0}
end
redis.call('SADD', KEYS[3], ARGV[1])
local left = redis.call('DECR', KEYS[2])
redis.call('HSET', KEYS[5], ARGV[2], ARGV[1])
redis.call('XADD', KEYS[4], '*', 'order_id', ARGV[2], 'sale_id', ARGV[3], 'user_id', ARGV[1], 'at_ms', now)
return {0, left}
