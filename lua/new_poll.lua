-- Put a newly created poll (window and options) into Redis, stamped with this run.
-- KEYS[1] meta hash   KEYS[2] options set
-- ARGV[1] opens_ms   ARGV[2] closes_ms   ARGV[3] closed (0|1)   ARGV[4..] option ids
redis.call('HSET', KEYS[1], 'opens_ms', ARGV[1], 'closes_ms', ARGV[2], 'closed', ARGV[3],
  'run', redis_run())
for i = 4, #ARGV do
  redis.call('SADD', KEYS[2], ARGV[i])
end
return #ARGV - 3
