-- Rate limit, fixed window: see lua/lib/limit_fixed_window.lua.
-- KEYS[1]  the policy's state for one subject
-- ARGV[1]  'take' or 'refund'   ARGV[2]  now in ms ('' = the Redis clock)
-- ARGV[3]  limit   ARGV[4]  window in ms
return limit_fixed_window(KEYS[1], ARGV[1], clock_ms(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]))
