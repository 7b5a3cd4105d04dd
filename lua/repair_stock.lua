-- After a repair added every settled buyer to the buyers set: units left become
-- stock_total minus buyers, atomically against concurrent purchases.
-- KEYS[1] stock counter   KEYS[2] buyers set
-- ARGV[1] stock_total from Postgres
-- Returns units left.
local left = tonumber(ARGV[1]) - redis.call('SCARD', KEYS[2])
if left < 0 then
  left = 0
end
redis.call('SET', KEYS[1], left)
return left
