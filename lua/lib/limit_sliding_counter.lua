-- Rate limit, sliding window counter: at most `limit` requests in any `window` ms,
-- estimated from two fixed windows. The previous window's count is weighted by
-- the share of it that still overlaps the sliding window:
--   estimate = prev * (window - elapsed) / window + cur
-- Constant memory per key (three small fields), approximate at the edges.
-- key: hash {w = current window number, cur = its count, prev = count of w - 1}
-- mode: 'take' or 'refund' (pass the `now` that the take returned, so it finds the
-- window it counted in)
-- Returns {allowed (1 or 0), remaining, ms until the next request would be
-- allowed, ms until the whole limit is available again, now in ms}.
-- A request is allowed when the estimate including it is at most the limit. All the
-- arithmetic is scaled by the window to stay in integers. A denied request writes
-- nothing; every write sets the expiry here.
local function limit_sliding_counter(key, mode, now, limit, window)
  local w = math.floor(now / window)
  local elapsed = now - w * window
  local state = redis.call('HMGET', key, 'w', 'cur', 'prev')
  local stored = tonumber(state[1])
  local cur, prev = 0, 0
  if stored == w then
    cur, prev = tonumber(state[2]) or 0, tonumber(state[3]) or 0
  elseif stored == w - 1 then
    prev = tonumber(state[2]) or 0
  end

  if mode == 'refund' then
    if stored == w and cur > 0 then
      redis.call('HINCRBY', key, 'cur', -1)
    end
    return {1, 0, 0, 0, now}
  end

  local function fits(p, c, e)
    return p * (window - e) + (c + 1) * window <= limit * window
  end

  -- Smallest elapsed time in a window (previous count p, current c) at which one
  -- more request fits, or nil when it cannot fit in that window at all.
  local function first_fit(p, c)
    if c + 1 > limit then
      return nil
    end
    if p == 0 then
      return 0
    end
    local e = window - math.floor((limit - c - 1) * window / p)
    if e >= window then
      return nil
    end
    return math.max(e, 0)
  end

  local function wait(p, c, e)
    local f = first_fit(p, c)
    if f ~= nil then
      return math.max(f - e, 0)
    end
    -- Not in this window: in the next one, this window's count becomes the previous.
    return (window - e) + (first_fit(c, 0) or window)
  end

  local function remaining(p, c, e)
    return math.max(math.floor((limit * window - p * (window - e) - c * window) / window), 0)
  end

  local function until_reset(p, c, e)
    if c > 0 then
      return 2 * window - e
    elseif p > 0 then
      return window - e
    end
    return 0
  end

  if not fits(prev, cur, elapsed) then
    return {0, remaining(prev, cur, elapsed), wait(prev, cur, elapsed),
            until_reset(prev, cur, elapsed), now}
  end
  cur = cur + 1
  redis.call('HSET', key, 'w', w, 'cur', cur, 'prev', prev)
  -- This window's count matters until the end of the next window.
  redis.call('PEXPIRE', key, 2 * window - elapsed)
  return {1, remaining(prev, cur, elapsed), wait(prev, cur, elapsed),
          until_reset(prev, cur, elapsed), now}
end
