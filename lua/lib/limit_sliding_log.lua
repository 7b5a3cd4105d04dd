-- Rate limit, sliding window log: at most `limit` requests in any `window` ms.
-- Exact, and memory grows with the limit (one entry per counted request).
-- State (a string): the times in ms of the counted requests still in the window,
-- oldest first, separated by spaces. Two requests in the same millisecond are two
-- entries.
-- limit_sliding_log(state, now, limit, window) returns
--   {allowed (1 or 0), remaining, ms until the next request would be allowed,
--    ms until the whole limit is available again, now in ms},
--   and, when allowed, the new state and its time to live in ms.
-- limit_sliding_log_undo(state, taken_at) removes one entry made at `taken_at`:
-- the new state, or nil for no change.
--
-- Edge: an entry made at t counts while now < t + window. At t + window exactly it
-- no longer counts (the window is (now - window, now]). A denied request is not
-- recorded. The newest entry is `now`, so the whole state is stale once `window`
-- has passed: that is its time to live.
-- The entries of `state` still in the window at `now`, oldest first, and how many.
local function limit_sliding_log_live(state, now, window)
  local live, count = {}, 0
  if state then
    local oldest = now - window
    for t in string.gmatch(state, '%-?%d+') do
      t = tonumber(t)
      if t > oldest then
        count = count + 1
        live[count] = t
      end
    end
  end
  return live, count
end

local function limit_sliding_log(state, now, limit, window)
  local live, count = limit_sliding_log_live(state, now, window)
  if count >= limit then
    -- The entry whose expiry lets one more request in.
    return {0, 0, (live[count - limit + 1] or now) + window - now, (live[count] or now) + window - now,
      now}
  end
  count = count + 1
  live[count] = now
  if count > 1 and live[count - 1] > now then
    table.sort(live) -- a replayed clock (tests) may go back; keep the order
  end
  local wait = 0
  if count >= limit then
    wait = live[count - limit + 1] + window - now
  end
  return {1, limit - count, wait, window, now}, table.concat(live, ' '), window
end

local function limit_sliding_log_undo(state, taken_at)
  local entries, found = {}, false
  for t in string.gmatch(state or '', '%-?%d+') do
    if not found and tonumber(t) == taken_at then
      found = true
    else
      entries[#entries + 1] = t
    end
  end
  if not found then
    return nil
  end
  return table.concat(entries, ' ')
end
