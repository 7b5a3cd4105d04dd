-- Apply one recorded stock change (a row of `stock_changes` in Postgres) exactly once.
-- The applied delta is remembered under the change id, so a retry after a crash
-- between Redis and Postgres answers the same delta instead of applying it twice.
-- KEYS[1] meta hash   KEYS[2] stock counter   KEYS[3] buyers set
-- KEYS[4] applied changes hash (change id -> delta, or 'refused')
-- ARGV[1] change id   ARGV[2] 'set' (units left become amount) or 'add'
-- ARGV[3] amount (>= 0)   ARGV[4] most units a sale may ever offer
-- Returns {code, delta, units left, units sold}:
--   0 applied (now or before)   1 refused: units ever offered would pass the maximum
--   4 not loaded   6 recovering (state not trusted by this Redis run)
local meta = redis.call('HMGET', KEYS[1], 'starts_ms', 'run')
if not meta[1] then
  return {4, 0, 0, 0}
end
if not same_run(meta[2]) then
  return {6, 0, 0, 0}
end
local left = redis.call('GET', KEYS[2])
if not left then
  return {6, 0, 0, 0}
end
left = tonumber(left)
local sold = redis.call('SCARD', KEYS[3])
local done = redis.call('HGET', KEYS[4], ARGV[1])
if done == 'refused' then
  return {1, 0, left, sold}
elseif done then
  return {0, tonumber(done), left, sold}
end
local amount = tonumber(ARGV[3])
local new_left = amount
if ARGV[2] == 'add' then
  new_left = left + amount
end
if new_left + sold > tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[4], ARGV[1], 'refused')
  return {1, 0, left, sold}
end
local delta = new_left - left
redis.call('SET', KEYS[2], new_left)
redis.call('HSET', KEYS[4], ARGV[1], delta)
return {0, delta, new_left, sold}
