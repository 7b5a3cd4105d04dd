-- Rate limit, sliding window log: at most LIMIT requests in any WINDOW ms.
-- Exact, and memory grows with LIMIT (one sorted-set entry per counted request).
-- KEYS[1]  sorted set: member = unique request id, score = time in ms
-- ARGV[1]  'take' (count this request if it fits) or 'refund' (undo one take)
-- ARGV[2]  now in ms. Production passes '' and the Redis clock (TIME) decides.
--          Tests pass a number to replay exact timings.
-- ARGV[3]  limit   ARGV[4]  window in ms
-- ARGV[5]  request id, unique per request (the caller makes it random), so two
--          requests in the same millisecond are two entries
-- Returns {allowed (1 or 0), remaining, ms until the next request would be
--          allowed, ms until the whole limit is available again, now in ms}.
--
-- Edge: an entry made at t counts while now < t + WINDOW. At t + WINDOW exactly it
-- no longer counts (the window is (now - WINDOW, now]). A denied request is not
-- recorded. Every write sets the expiry in this script.
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
local key = KEYS[1]

if ARGV[1] == 'refund' then
  redis.call('ZREM', key, ARGV[5])
  return {1, 0, 0, 0, now}
end

-- The entry whose expiry lets one more request in, when `count` entries are live.
local function wait_for_slot(count)
  if count < limit then
    return 0
  end
  local idx = count - limit
  local entry = redis.call('ZRANGE', key, idx, idx, 'WITHSCORES')
  return tonumber(entry[2]) + window - now
end

redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local count = redis.call('ZCARD', key)
if count >= limit then
  local newest = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
  return {0, 0, wait_for_slot(count), tonumber(newest[2]) + window - now, now}
end
redis.call('ZADD', key, now, ARGV[5])
-- The newest entry is `now`, so every entry is stale once WINDOW has passed.
redis.call('PEXPIRE', key, window)
count = count + 1
return {1, limit - count, wait_for_slot(count), window, now}
