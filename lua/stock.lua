-- Set or top up a sale's stock atomically, against concurrent buyers.
-- KEYS[1] stock counter   KEYS[2] buyers set   KEYS[3] meta hash
-- ARGV[1] 'set' or 'add'   ARGV[2] amount (>= 0, checked by the caller)
-- Returns {units left, units sold} or {-1, 0} when the sale is not loaded.
if redis.call('EXISTS', KEYS[3]) == 0 then
  return {-1, 0}
end
local left
if ARGV[1] == 'set' then
  redis.call('SET', KEYS[1], ARGV[2])
  left = tonumber(ARGV[2])
else
  left = redis.call('INCRBY', KEYS[1], ARGV[2])
end
return {left, redis.call('SCARD', KEYS[2])}
