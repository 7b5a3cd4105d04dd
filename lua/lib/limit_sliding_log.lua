-- Rate limit, sliding window log: at most `limit` requests in any `window` ms.
-- Exact, and memory grows with the limit (one entry per counted request).
-- State (a string): the times in ms of the counted requests still in the window,
-- oldest first, each 13 digits with leading zeros (good until the year 2286), with
-- nothing between them, so the k-th entry is found without reading the others.
-- Two requests in the same millisecond are two entries. Parsed state is the text
-- itself: limit_sliding_log_read(text) checks its layout cheaply (nil for none or
-- another layout) and limit_sliding_log_text(state) is the state.
-- limit_sliding_log(state, now, limit, window) returns
--   {allowed (1 or 0), remaining, ms until the next request would be allowed,
--    ms until the whole limit is available again, now in ms},
--   and, when allowed, the new state and its time to live in ms.
-- limit_sliding_log_take(state, now, limit, window) is the same decision without
-- the answer: the new state and its time to live when allowed, else nil.
-- limit_sliding_log_undo(state, taken_at) removes one entry made at `taken_at`:
-- the new state, or nil for no change.
--
-- Edge: an entry made at t counts while now < t + window. At t + window exactly it
-- no longer counts (the window is (now - window, now]). A denied request is not
-- recorded. The newest entry is `now`, so the whole state is stale once `window`
-- has passed: that is its time to live.
local LOG_WIDTH = 13

-- The k-th entry (from 1) of a log. An entry that is not a number (a key someone
-- wrote by hand) reads as 0: stale, so it is dropped, never an error.
local function limit_sliding_log_at(log, k)
  return tonumber(string.sub(log, (k - 1) * LOG_WIDTH + 1, k * LOG_WIDTH)) or 0
end

-- An entry's text. A batch asks for the same `now` (and `now - window`) once per
-- request: the last one formatted is kept.
local sliding_log_last_t, sliding_log_last_text
local function limit_sliding_log_entry(t)
  if t ~= sliding_log_last_t then
    sliding_log_last_t, sliding_log_last_text = t, string.format('%013d', t)
  end
  return sliding_log_last_text
end

local function limit_sliding_log_read(text)
  if not text or #text % LOG_WIDTH ~= 0 or string.find(text, ' ', 1, true) then
    return nil
  end
  return text
end

local function limit_sliding_log_text(state)
  return state
end

-- A log and its number of entries (none: empty).
local function limit_sliding_log_len(state)
  if not state then
    return '', 0
  end
  return state, #state / LOG_WIDTH
end

-- The log at `now`: its text, its number of entries, and the first entry still in
-- the window (entries are in order, so the stale ones are at the front).
local function limit_sliding_log_window(state, now, window)
  local log, n = limit_sliding_log_len(state)
  local oldest = now - window
  local first = 1
  while first <= n and limit_sliding_log_at(log, first) <= oldest do
    first = first + 1
  end
  return log, n, first
end

-- The live entries (from `first`) with one made at `now`, and their number.
local function limit_sliding_log_append(log, n, first, now)
  local count = n - first + 1
  -- Usually nothing went stale since the last request: the log as it is (a
  -- substring would copy it once more).
  local live = log
  if first > 1 then
    live = string.sub(log, (first - 1) * LOG_WIDTH + 1)
  end
  if count > 0 and limit_sliding_log_at(log, n) > now then
    -- A replayed clock (tests) went back: put this entry in its place.
    local times = {now}
    for k = first, n do
      times[#times + 1] = limit_sliding_log_at(log, k)
    end
    table.sort(times)
    for k, t in ipairs(times) do
      times[k] = string.format('%013d', t)
    end
    return table.concat(times), count + 1
  end
  return live .. limit_sliding_log_entry(now), count + 1
end

-- One more request at `now`, when it fits: the new state and its time to live, or
-- nil. The batch scripts take with this, and ask limit_sliding_log for the answer
-- only where a reply reports it.
local function limit_sliding_log_take(state, now, limit, window)
  if not state then
    -- A subject with no log (a fresh buyer): its first entry, if any fits.
    if limit < 1 then
      return nil
    end
    return limit_sliding_log_entry(now), window
  end
  local log, n, first = limit_sliding_log_window(state, now, window)
  if n - first + 1 >= limit then
    return nil
  end
  return (limit_sliding_log_append(log, n, first, now)), window
end

local function limit_sliding_log(state, now, limit, window)
  local log, n, first = limit_sliding_log_window(state, now, window)
  local count = n - first + 1
  if count >= limit then
    -- The entry whose expiry lets one more request in, and the newest.
    return {0, 0, limit_sliding_log_at(log, first + count - limit) + window - now,
      limit_sliding_log_at(log, n) + window - now, now}
  end
  local live
  live, count = limit_sliding_log_append(log, n, first, now)
  local wait = 0
  if count >= limit then
    wait = limit_sliding_log_at(live, count - limit + 1) + window - now
  end
  return {1, limit - count, wait, window, now}, live, window
end

-- The answer limit_sliding_log gave a request it allowed, from the log after it:
-- no second decision for a reply that reports it. Its remaining and reset as two
-- numbers (a batch's reply takes them without a table per request; it reports no
-- wait for an allowed request, see limits_append_taken). The arguments every
-- algorithm's are called with (limit_taken_of): the state before the take (not
-- needed here), the log after it, now (not needed), limit and window.
local function limit_sliding_log_taken(_, log, _, limit, window)
  return limit - #log / LOG_WIDTH, window
end

local function limit_sliding_log_undo(state, taken_at)
  local log, n = limit_sliding_log_len(state)
  local entry = limit_sliding_log_entry(taken_at)
  for k = n, 1, -1 do
    if string.sub(log, (k - 1) * LOG_WIDTH + 1, k * LOG_WIDTH) == entry then
      return string.sub(log, 1, (k - 1) * LOG_WIDTH) .. string.sub(log, k * LOG_WIDTH + 1)
    end
  end
  return nil
end
