-- Rate limit, sliding window log: at most `limit` requests in any `window` ms.
-- Exact, and memory grows with the limit (one sorted-set entry per counted request).
-- key: sorted set, member = unique request id, score = time in ms
-- mode: 'take' or 'refund' (undo the take of `request_id`)
-- request_id: unique per request (the caller makes it random), so two requests in
-- the same millisecond are two entries
-- Returns {allowed (1 or 0), remaining, ms until the next request would be
-- allowed, ms until the whole limit is available again, now in ms}.
--
-- Edge: an entry made at t counts while now < t + window. At t + window exactly it
-- no longer counts (the window is (now - window, now]). A denied request is not
-- recorded. Every write sets the expiry here.
local function limit_sliding_log(key, mode, now, limit, window, request_id)
  if mode == 'refund' then
    redis.call('ZREM', key, request_id)
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
  redis.call('ZADD', key, now, request_id)
  -- The newest entry is `now`, so every entry is stale once the window has passed.
  redis.call('PEXPIRE', key, window)
  count = count + 1
  return {1, limit - count, wait_for_slot(count), window, now}
end
