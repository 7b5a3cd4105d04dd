-- Rate limit, token bucket: see lua/lib/limit_token_bucket.lua.
-- KEYS[1]  the policy's state for one subject
-- ARGV[1]  'take' or 'refund'   ARGV[2]  now in ms ('' = the Redis clock)
-- ARGV[3]  capacity   ARGV[4]  refill rate per second   ARGV[5]  cost
return limit_token_bucket(KEYS[1], ARGV[1], clock_ms(ARGV[2]), tonumber(ARGV[3]),
  tonumber(ARGV[4]), tonumber(ARGV[5]))
