-- Load (or refresh) a poll's window and options into Redis. Tallies and voters are
-- never touched, so reloading a live poll loses no vote.
-- KEYS[1] meta hash   KEYS[2] options set
-- ARGV[1] opens_ms   ARGV[2] closes_ms   ARGV[3] closed (0|1)   ARGV[4..] option ids
redis.call('HSET', KEYS[1], 'opens_ms', ARGV[1], 'closes_ms', ARGV[2], 'closed', ARGV[3])
for i = 4, #ARGV do
  redis.call('SADD', KEYS[2], ARGV[i])
end
return #ARGV - 3
