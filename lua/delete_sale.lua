-- Removes a sale nobody bought from Redis, atomically with respect to purchases:
-- a purchase decided before this sees the sale, one after finds no state (and,
-- once Postgres commits the delete, 404).
-- KEYS[1] meta   KEYS[2] stock   KEYS[3] buyers   KEYS[4] orders stream
-- KEYS[5] pending hash   KEYS[6] changes   KEYS[7] rebuild token   KEYS[8] units
-- KEYS[9] units sold
-- Returns 1 when removed (or never there), 0 when the sale has a buyer or an order.
if redis.call('SCARD', KEYS[3]) > 0 or redis.call('HLEN', KEYS[5]) > 0
    or redis.call('HLEN', KEYS[8]) > 0
    or tonumber(redis.call('GET', KEYS[9]) or '0') > 0 then
  return 0
end
if redis.call('EXISTS', KEYS[4]) == 1 and redis.call('XLEN', KEYS[4]) > 0 then
  return 0
end
redis.call('DEL', unpack(KEYS))
return 1
