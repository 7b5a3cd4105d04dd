-- Rate limit, sliding window counter: at most `limit` requests in any `window` ms,
-- estimated from two fixed windows. The previous window's count is weighted by
-- the share of it that still overlaps the sliding window:
--   estimate = prev * (window - elapsed) / window + cur
-- Constant memory per key, approximate at the edges.
-- State: the key's text is "<current window number> <its count> <count of the one
-- before>"; parsed, {window number, its count, count of the one before}.
-- limit_sliding_counter_read(text) is the parsed state, or nil for none;
-- limit_sliding_counter_text(state) its text (see lua/lib/limit_fixed_window.lua).
-- limit_sliding_counter(state, now, limit, window) returns
--   {allowed (1 or 0), remaining, ms until the next request would be allowed,
--    ms until the whole limit is available again, now in ms},
--   and, when allowed, the new state and its time to live in ms.
-- limit_sliding_counter_take(state, now, limit, window): the same decision without
-- the answer (the new state and its time to live, or nil).
-- limit_sliding_counter_taken(_, state, now, limit, window): the remaining and reset
-- of the answer it gave a request it allowed, from the state after it.
-- limit_sliding_counter_undo(state, taken_at, window) gives back one request
-- counted at `taken_at`: the new state, or nil for no change.
-- A request is allowed when the estimate including it is at most the limit. All the
-- arithmetic is scaled by the window to stay in integers.
local function limit_sliding_counter_read(text)
  local w, cur, prev = string.match(text or '', '^(%-?%d+) (%d+) (%d+)$')
  if not w then
    return nil
  end
  return {tonumber(w), tonumber(cur), tonumber(prev)}
end

local function limit_sliding_counter_text(state)
  return string.format('%d %d %d', state[1], state[2], state[3])
end

-- Smallest elapsed time in a window (previous count p, current c) at which one
-- more request fits, or nil when it cannot fit in that window at all.
local function limit_sliding_counter_first_fit(limit, window, p, c)
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

-- Remaining and reset for counts p, c at `elapsed` ms into the window.
-- Here and in limit_sliding_counter_counts, floor(x / window) is written
-- (x - x % window) / window: Lua's % rounds towards minus infinity as math.floor
-- does, and the batch scripts pay no call into C for it, once or twice per request.
local function limit_sliding_counter_left(limit, window, p, c, elapsed)
  local x = limit * window - p * (window - elapsed) - c * window
  local remaining = (x - x % window) / window
  if remaining < 0 then
    remaining = 0
  end
  local reset = 0
  if c > 0 then
    reset = 2 * window - elapsed
  elseif p > 0 then
    reset = window - elapsed
  end
  return remaining, reset
end

-- Remaining, wait and reset for counts p, c at `elapsed` ms into the window.
local function limit_sliding_counter_numbers(limit, window, p, c, elapsed)
  local remaining, reset = limit_sliding_counter_left(limit, window, p, c, elapsed)
  local wait
  local f = limit_sliding_counter_first_fit(limit, window, p, c)
  if f ~= nil then
    wait = math.max(f - elapsed, 0)
  else
    -- Not in this window: in the next one, this window's count becomes the previous.
    wait = (window - elapsed) + (limit_sliding_counter_first_fit(limit, window, c, 0) or window)
  end
  return remaining, wait, reset
end

-- {allowed, remaining, wait, reset, now} for counts p, c at `elapsed` ms into the
-- window.
local function limit_sliding_counter_answer(allowed, limit, window, p, c, elapsed, now)
  local remaining, wait, reset = limit_sliding_counter_numbers(limit, window, p, c, elapsed)
  return {allowed, remaining, wait, reset, now}
end

-- The window `now` falls in, the ms elapsed in it, and its count and the previous
-- window's.
local function limit_sliding_counter_counts(state, now, window)
  local w = (now - now % window) / window
  local cur, prev = 0, 0
  if state and state[1] == w then
    cur, prev = state[2], state[3]
  elseif state and state[1] == w - 1 then
    prev = state[2]
  end
  return w, now - w * window, cur, prev
end

-- One more request at `now`, when it fits: the new state and its time to live, or
-- nil (the batch scripts' take; see lua/lib/limit_sliding_log.lua).
local function limit_sliding_counter_take(state, now, limit, window)
  local w, elapsed, cur, prev = limit_sliding_counter_counts(state, now, window)
  if prev * (window - elapsed) + (cur + 1) * window > limit * window then
    return nil
  end
  -- This window's count matters until the end of the next window.
  return {w, cur + 1, prev}, 2 * window - elapsed
end

local function limit_sliding_counter(state, now, limit, window)
  local new_state, ttl = limit_sliding_counter_take(state, now, limit, window)
  local _, elapsed, cur, prev = limit_sliding_counter_counts(state, now, window)
  if not new_state then
    return limit_sliding_counter_answer(0, limit, window, prev, cur, elapsed, now)
  end
  return limit_sliding_counter_answer(1, limit, window, prev, cur + 1, elapsed, now),
    new_state, ttl
end

-- The answer limit_sliding_counter gave a request it allowed, from the state after
-- it ({window number, count with it, previous count}): its remaining and reset (see
-- limit_sliding_log_taken).
local function limit_sliding_counter_taken(_, state, now, limit, window)
  return limit_sliding_counter_left(limit, window, state[3], state[2],
    now - state[1] * window)
end

local function limit_sliding_counter_undo(state, taken_at, window)
  if not state or state[1] ~= math.floor(taken_at / window) or state[2] <= 0 then
    return nil
  end
  return {state[1], state[2] - 1, state[3]}
end
