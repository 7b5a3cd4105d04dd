-- Load (or refresh) a sale's window into Redis; set its stock only when absent, so
-- reloading a live sale never undoes purchases.
-- KEYS[1] meta hash   KEYS[2] stock counter
-- ARGV[1] starts_ms   ARGV[2] ends_ms   ARGV[3] closed (0|1)   ARGV[4] initial stock
redis.call('HSET', KEYS[1], 'starts_ms', ARGV[1], 'ends_ms', ARGV[2], 'closed', ARGV[3])
redis.call('SET', KEYS[2], ARGV[4], 'NX')
return tonumber(redis.call('GET', KEYS[2]))
