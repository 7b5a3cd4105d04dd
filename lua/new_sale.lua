-- Put a newly created sale into Redis, stamped with this Redis run.
-- KEYS[1] meta hash   KEYS[2] stock counter
-- ARGV[1] starts_ms   ARGV[2] ends_ms   ARGV[3] closed (0|1)   ARGV[4] stock
redis.call('HSET', KEYS[1], 'starts_ms', ARGV[1], 'ends_ms', ARGV[2], 'closed', ARGV[3],
  'run', redis_run())
redis.call('SET', KEYS[2], ARGV[4])
return 1
