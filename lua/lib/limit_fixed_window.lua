-- Rate limit, fixed window: at most `limit` requests in each window of `window` ms.
-- Windows are aligned to multiples of `window` on the Redis clock, so every app
-- server agrees where a window starts.
-- key: hash {w = window number, n = requests counted in window w}
-- mode: 'take' (count this request if it fits) or 'refund' (undo one take; pass the
-- `now` that the take returned, so it finds the window it counted in)
-- Returns {allowed (1 or 0), remaining, ms until the next request would be
-- allowed, ms until the whole limit is available again, now in ms}.
-- A denied request writes nothing. Every write sets the expiry here, so no key is
-- ever left without a TTL.
local function limit_fixed_window(key, mode, now, limit, window)
  local w = math.floor(now / window)
  local reset = (w + 1) * window - now -- at least 1
  local state = redis.call('HMGET', key, 'w', 'n')
  local n = 0
  if tonumber(state[1]) == w then
    n = tonumber(state[2]) or 0
  end

  if mode == 'refund' then
    -- Only while the counted window lasts; the key keeps its expiry.
    if n > 0 then
      redis.call('HINCRBY', key, 'n', -1)
    end
    return {1, limit - math.max(n - 1, 0), 0, reset, now}
  end

  if n >= limit then
    return {0, 0, reset, reset, now}
  end
  n = n + 1
  redis.call('HSET', key, 'w', w, 'n', n)
  redis.call('PEXPIRE', key, reset)
  local retry = 0
  if n >= limit then
    retry = reset
  end
  return {1, limit - n, retry, reset, now}
end
