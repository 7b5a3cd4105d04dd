-- Decide one purchase atomically.
-- KEYS[1] meta hash (starts_ms, ends_ms, closed, run)   KEYS[2] stock counter
-- KEYS[3] buyers set   KEYS[4] orders stream   KEYS[5] pending hash (order id -> user id)
-- ARGV[1] user id   ARGV[2] order id   ARGV[3] sale id
-- Returns {code, value}:
--   0 accepted (value = units left)   1 already bought   2 not started (value = ms to start)
--   3 ended or closed   4 not loaded (this Redis has no such sale)   5 sold out
--   6 recovering (the state is not trusted by this Redis run: rebuild it from Postgres)
local meta = redis.call('HMGET', KEYS[1], 'starts_ms', 'ends_ms', 'closed', 'run')
if not meta[1] then
  return {4, 0}
end
if not same_run(meta[4]) then
  return {6, 0}
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
local stock = redis.call('GET', KEYS[2])
if not stock then
  -- Meta without stock: part of the state was lost (eviction?). Never guess.
  return {6, 0}
end
if tonumber(stock) <= 0 then
  return {5, 0}
end
redis.call('SADD', KEYS[3], ARGV[1])
local left = redis.call('DECR', KEYS[2])
redis.call('HSET', KEYS[5], ARGV[2], ARGV[1])
redis.call('XADD', KEYS[4], '*', 'order_id', ARGV[2], 'sale_id', ARGV[3], 'user_id', ARGV[1], 'at_ms', now)
return {0, left}
