-- Rate limit, fixed window: at most `limit` requests in each window of `window` ms.
-- Windows are aligned to multiples of `window` on the Redis clock, so every app
-- server agrees where a window starts.
-- State: the key's text is "<window number> <requests counted in it>"; the
-- algorithm works on it parsed, {window number, count} (see below).
--
-- Like every algorithm in lua/lib/limit_*.lua, it never calls Redis itself and
-- works on parsed state: lua/lib/limits.lua reads a subject's state once (a key's
-- GET, or a field of a batch's HMGET, then limit_*_read) and writes it once
-- (limit_*_text, then SET with its expiry, or the batch's HSET), so a batch of
-- requests costs one read, one parse, one format and at most one write per
-- subject, whatever the number of requests that count in it.
-- limit_fixed_window_read(text) is the parsed state, or nil for none (or text of
-- another layout); limit_fixed_window_text(state) its text.
-- limit_fixed_window(state, now, limit, window) returns
--   {allowed (1 or 0), remaining, ms until the next request would be allowed,
--    ms until the whole limit is available again, now in ms},
--   and, when allowed, the new state and its time to live in ms (a denied request
--   writes nothing).
-- limit_fixed_window_undo(state, taken_at, window) gives back one request counted
-- at `taken_at` (the `now` its take answered): the new state, or nil for no change.
local function limit_fixed_window_read(text)
  local w, n = string.match(text or '', '^(%-?%d+) (%d+)$')
  if not w then
    return nil
  end
  return {tonumber(w), tonumber(n)}
end

local function limit_fixed_window_text(state)
  return string.format('%d %d', state[1], state[2])
end

local function limit_fixed_window(state, now, limit, window)
  local w = math.floor(now / window)
  local reset = (w + 1) * window - now -- at least 1
  local n = 0
  if state and state[1] == w then
    n = state[2]
  end
  if n >= limit then
    return {0, 0, reset, reset, now}
  end
  n = n + 1
  local retry = 0
  if n >= limit then
    retry = reset
  end
  return {1, limit - n, retry, reset, now}, {w, n}, reset
end

local function limit_fixed_window_undo(state, taken_at, window)
  if not state or state[1] ~= math.floor(taken_at / window) or state[2] <= 0 then
    return nil
  end
  return {state[1], state[2] - 1}
end
