-- Put a newly created poll (window, ballot settings and options) into Redis, stamped
-- with this run.
-- KEYS[1] meta hash   KEYS[2] options set
-- ARGV[1] opens_ms   ARGV[2] closes_ms   ARGV[3] closed (0|1)   ARGV[4] ballot settings
-- (see lua/vote_batch.lua)   ARGV[5..] option ids
redis.call('HSET', KEYS[1], 'opens_ms', ARGV[1], 'closes_ms', ARGV[2], 'closed', ARGV[3],
  'ballot', ARGV[4], 'run', redis_run())
for i = 5, #ARGV do
  redis.call('SADD', KEYS[2], ARGV[i])
end
return #ARGV - 4
