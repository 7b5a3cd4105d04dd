-- Put a newly created sale into Redis, stamped with this Redis run.
-- KEYS[1] meta hash   KEYS[2] stock counter   KEYS[3] units sold counter
-- KEYS[4] where an earlier version kept its buyers set: the marker ARGV[8] (see
-- src/sale/legacy.rs)
-- ARGV[1] starts_ms   ARGV[2] ends_ms   ARGV[3] closed (0|1)   ARGV[4] stock
-- ARGV[5] most units per customer (1: the buyers hash is the only per-user state; more:
-- units are counted per buyer and in all, see lua/purchase_batch.lua)
-- ARGV[6] waiting room: admissions a second (0: none; -1: a draw)   ARGV[7] when its line opens (ms)
-- ARGV[8] the marker
redis.call('HSET', KEYS[1], 'starts_ms', ARGV[1], 'ends_ms', ARGV[2], 'closed', ARGV[3],
  'per_user', ARGV[5], 'wr', ARGV[6], 'q_opens_ms', ARGV[7], 'run', redis_run())
redis.call('SET', KEYS[2], ARGV[4])
redis.call('SET', KEYS[4], ARGV[8])
if tonumber(ARGV[5]) > 1 then
  redis.call('SET', KEYS[3], 0)
end
return 1
