-- Finish a sale's rebuild: every buyer (settled in Postgres, unsettled in the stream,
-- already in the hash) has been added to the buyers hash (and, on a sale of more than
-- one per customer, units per buyer and units sold written); units left become units
-- ever offered minus units sold, and the state is stamped with this Redis run.
-- KEYS[1] meta hash   KEYS[2] stock counter   KEYS[3] buyers hash
-- KEYS[4] applied changes hash   KEYS[5] rebuild token key   KEYS[6] units sold
-- counter (on a sale of more than one per customer, written by the rebuild first)
-- KEYS[7] where an earlier version kept its buyers set (folded by the rebuild
-- first): the marker ARGV[9] (see src/sale/legacy.rs)
-- ARGV[1] token   ARGV[2] starts_ms   ARGV[3] ends_ms   ARGV[4] closed (0|1)
-- ARGV[5] units ever offered (stock_total, applied changes only)
-- ARGV[6] most units per customer   ARGV[7] waiting room: admissions a second (0:
-- none)   ARGV[8] when its line opens (ms)   ARGV[9] the marker   ARGV[10 ..] ids
-- of returns the rebuild
-- already counted (left out their buyers): remembered as applied with delta 0
-- Returns {units left, units sold}, or {-1, 0} when the token is gone (start over).
if redis.call('GET', KEYS[5]) ~= ARGV[1] then
  return {-1, 0}
end
local sold = sold_units(KEYS[6], KEYS[3])
local left = tonumber(ARGV[5]) - sold
if left < 0 then
  left = 0
end
redis.call('SET', KEYS[2], left)
redis.call('SET', KEYS[7], ARGV[9])
-- Changes not yet recorded as applied in Postgres are applied again after this.
redis.call('DEL', KEYS[4])
for i = 10, #ARGV do
  redis.call('HSET', KEYS[4], ARGV[i], 0)
end
redis.call('HSET', KEYS[1], 'starts_ms', ARGV[2], 'ends_ms', ARGV[3], 'closed', ARGV[4],
  'per_user', ARGV[6], 'wr', ARGV[7], 'q_opens_ms', ARGV[8], 'run', redis_run())
redis.call('DEL', KEYS[5])
return {left, sold}
