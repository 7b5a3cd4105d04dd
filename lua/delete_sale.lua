-- Removes a sale nobody bought from Redis, atomically with respect to purchases:
-- a purchase decided before this sees the sale, one after finds no state (and,
-- once Postgres commits the delete, 404).
-- KEYS[1] meta   KEYS[2] stock   KEYS[3] buyers hash   KEYS[4] orders stream
-- KEYS[5] pending hash   KEYS[6] changes   KEYS[7] rebuild token   KEYS[8] units
-- KEYS[9] units sold   KEYS[10] the orders stream of earlier versions
-- KEYS[11] an earlier version's buyers set (or the marker where it was)   KEYS[12 ..] the waiting room's line, state, admissions
-- and joins (removed too)
-- Returns:
--   1 removed (or never there)   0 the sale has a buyer or an order
if redis.call('HLEN', KEYS[3]) > 0 or redis.call('TYPE', KEYS[11])['ok'] == 'set'
    or redis.call('HLEN', KEYS[5]) > 0
    or redis.call('HLEN', KEYS[8]) > 0
    or tonumber(redis.call('GET', KEYS[9]) or '0') > 0 then
  return 0
end
for _, stream in ipairs({KEYS[4], KEYS[10]}) do
  if redis.call('EXISTS', stream) == 1 and redis.call('XLEN', stream) > 0 then
    return 0
  end
end
redis.call('DEL', unpack(KEYS))
return 1
