-- Rate limit, fixed window: at most LIMIT requests in each window of WINDOW ms.
-- Windows are aligned to multiples of WINDOW on the Redis clock, so every app
-- server agrees where a window starts.
-- KEYS[1]  hash {w = window number, n = requests counted in window w}
-- ARGV[1]  'take' (count this request if it fits) or 'refund' (undo one take)
-- ARGV[2]  now in ms. Production passes '' and the Redis clock (TIME) decides.
--          Tests pass a number to replay exact timings; a refund passes the `now`
--          that its take returned, so it finds the window it counted in.
-- ARGV[3]  limit   ARGV[4]  window in ms
-- Returns {allowed (1 or 0), remaining, ms until the next request would be
--          allowed, ms until the whole limit is available again, now in ms}.
-- A denied request writes nothing. Every write sets the expiry in this script,
-- so no key is ever left without a TTL.
local function clock()
  if ARGV[2] ~= '' then
    return tonumber(ARGV[2])
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local now = clock()
local limit = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local w = math.floor(now / window)
local reset = (w + 1) * window - now -- at least 1
local state = redis.call('HMGET', KEYS[1], 'w', 'n')
local n = 0
if tonumber(state[1]) == w then
  n = tonumber(state[2]) or 0
end

if ARGV[1] == 'refund' then
  -- Only while the counted window lasts; the key keeps its expiry.
  if n > 0 then
    redis.call('HINCRBY', KEYS[1], 'n', -1)
  end
  return {1, limit - math.max(n - 1, 0), 0, reset, now}
end

if n >= limit then
  return {0, 0, reset, reset, now}
end
n = n + 1
redis.call('HSET', KEYS[1], 'w', w, 'n', n)
redis.call('PEXPIRE', KEYS[1], reset)
local retry = 0
if n >= limit then
  retry = reset
end
return {1, limit - n, retry, reset, now}
