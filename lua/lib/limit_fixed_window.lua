-- Rate limit, fixed window: at most `limit` requests in each window of `window` ms.
-- Windows are aligned to multiples of `window` on the Redis clock, so every app
-- server agrees where a window starts.
-- State (a string): "<window number> <requests counted in it>".
--
-- Like every algorithm in lua/lib/limit_*.lua, it works on the state's text and
-- never calls Redis itself: lua/lib/limits.lua reads a key once (GET) and writes it
-- once (SET with its expiry), so a batch of requests costs one read and at most one
-- write per key, whatever the number of requests that count in it.
-- limit_fixed_window(state, now, limit, window) returns
--   {allowed (1 or 0), remaining, ms until the next request would be allowed,
--    ms until the whole limit is available again, now in ms},
--   and, when allowed, the new state and its time to live in ms (a denied request
--   writes nothing).
-- limit_fixed_window_undo(state, taken_at) gives back one request counted at
-- `taken_at` (the `now` its take answered): the new state, or nil for no change.
local function limit_fixed_window_parse(state)
  local w, n = string.match(state or '', '^(%-?%d+) (%d+)$')
  return tonumber(w), tonumber(n) or 0
end

local function limit_fixed_window(state, now, limit, window)
  local w = math.floor(now / window)
  local reset = (w + 1) * window - now -- at least 1
  local stored, n = limit_fixed_window_parse(state)
  if stored ~= w then
    n = 0
  end
  if n >= limit then
    return {0, 0, reset, reset, now}
  end
  n = n + 1
  local retry = 0
  if n >= limit then
    retry = reset
  end
  return {1, limit - n, retry, reset, now}, w .. ' ' .. n, reset
end

local function limit_fixed_window_undo(state, taken_at, window)
  local stored, n = limit_fixed_window_parse(state)
  if stored ~= math.floor(taken_at / window) or n <= 0 then
    return nil
  end
  return stored .. ' ' .. (n - 1)
end
