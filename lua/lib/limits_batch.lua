-- A batch's limits taken a policy at a time, for the common case: nobody refused.
--
-- limits_take (lua/lib/limits.lua) takes every policy for one request, request by
-- request, all or nothing; a request one policy refuses is counted by none. While
-- nobody is refused, each policy's states evolve on their own: policy p's state
-- after request k depends only on the requests before it under p. So a batch whose
-- policies are all sliding logs and sliding counters (the shipped shapes) takes
-- them here one policy at a time over its requests, each algorithm's take and its
-- 202 numbers written inline (no call, no table per request), up to the first
-- request some policy refuses. The requests before it are taken exactly as
-- limits_take would have taken them, with the same states left and the same
-- numbers answered (remaining per policy, see limits_append_taken); the
-- states of the requests after it are given back (each policy's table is set to
-- what it held after the last request kept), and limits_take decides them one by
-- one from there. A batch with another algorithm goes to limits_take from its first
-- request.
-- Held by tests/api/limit_batch.rs (the batch's answers and states against limits_take's,
-- request by request, over batches with and without refusals).

-- Policy p's take over counted[1 .. upto - 1] (the items' indexes; item i's subject
-- at subjects[(i - 1) * P + p]): fills rem (at (i - 1) * P + p) with each
-- request's remaining (its reset is the batch's: limits_batch_resets), and t
-- (subject -> state) with the states after
-- them; `after` (at the same places) with what limits_batch_rewind needs: the log
-- after the request (sliding log) or the count of the current window (sliding
-- counter). Returns the position in counted of the first request it refuses (t
-- then holds some of the requests before it: limits_batch_rewind sets it back),
-- or upto.
local function limits_batch_policy(t, policy, p, P, subjects, counted, upto, now, rem, after)
  local alg, limit, window = policy[1], policy[2], policy[3]
  if alg == 'sl' then
    -- A subject without a log: its first entry, the same text for every one.
    -- (Its remaining: limit - 1, with no length to take and divide.)
    local first = limit >= 1 and limit_sliding_log_entry(now) or nil
    local take = limit_sliding_log_take
    for k = 1, upto - 1 do
      local at = (counted[k] - 1) * P + p
      local id = subjects[at]
      local state = t[id]
      if not state then
        if not first then
          return k
        end
        t[id] = first
        after[at], rem[at] = first, limit - 1
      else
        local log = take(state, now, limit, window)
        if not log then
          return k
        end
        t[id] = log
        after[at], rem[at] = log, limit - #log / LOG_WIDTH
      end
    end
    return upto
  end
  -- Sliding counter: each subject's counts once, then a running count (see
  -- limit_sliding_counter_take and limit_sliding_counter_taken). `room`, per
  -- subject: limit * window - prev * (window - elapsed), found once; a request
  -- fits while room - cur * window (cur counting it) is not below 0, which is
  -- the take's test, and remaining is floor of that over the window, as
  -- limit_sliding_counter_left finds it (never below 0 for a request that fits).
  -- Whole numbers of ms and requests: exact in Lua's doubles.
  local w, elapsed = limit_sliding_counter_counts(nil, now, window)
  local prev_of, cur_of, room_of = {}, {}, {}
  local changed, c = {}, 0
  for k = 1, upto - 1 do
    local at = (counted[k] - 1) * P + p
    local id = subjects[at]
    local cur = cur_of[id]
    local room
    if cur then
      room = room_of[id]
    else
      local _, prev
      _, _, cur, prev = limit_sliding_counter_counts(t[id], now, window)
      prev_of[id] = prev
      room = limit * window - prev * (window - elapsed)
      room_of[id] = room
      c = c + 1
      changed[c] = id
    end
    cur = cur + 1
    local x = room - cur * window
    if x < 0 then
      -- Refused: limits_batch_take sets the states back (t is not written yet).
      return k
    end
    cur_of[id] = cur
    after[at], rem[at] = cur, (x - x % window) / window
  end
  -- A new state for a subject its requests counted in (limits_write writes a state
  -- that is not the one read).
  for j = 1, c do
    local id = changed[j]
    t[id] = {w, cur_of[id], prev_of[id]}
  end
  return upto
end

-- Policy p's states as they were after counted[upto - 1]: from the states read
-- (limits_preload), each subject's last request before upto.
local function limits_batch_rewind(cache, p, P, subjects, counted, upto, now, after)
  local t, policy = cache.tables[p], cache.policies[p]
  local ids, read_states = cache.subjects[p], cache.read[p]
  for k = 1, #ids do
    t[ids[k]] = read_states[k]
  end
  if policy[1] == 'sl' then
    for k = 1, upto - 1 do
      local at = (counted[k] - 1) * P + p
      t[subjects[at]] = after[at]
    end
    return
  end
  local window = policy[3]
  local last = {}
  for k = 1, upto - 1 do
    local at = (counted[k] - 1) * P + p
    last[subjects[at]] = after[at]
  end
  for id, cur in pairs(last) do
    local w, _, _, prev = limit_sliding_counter_counts(t[id], now, window)
    t[id] = {w, cur, prev}
  end
end

-- Takes the batch's counted requests (`counted`: item indexes, in order) under
-- every policy while nobody is refused. Returns the position in counted of the
-- first request left to limits_take (#counted + 1 when none), and per item
-- position (i - 1) * P + p the remaining of each request taken here.
-- The cache's tables hold the states after the last request taken here.
local function limits_batch_take(cache, subjects, policies, counted, now, after)
  local P, upto = #policies, #counted + 1
  for p = 1, P do
    local alg = policies[p][1]
    if alg ~= 'sl' and alg ~= 'sc' then
      return 1, {}
    end
  end
  -- Places up to the last counted item's (see presized in lua/lib/run.lua).
  local last = (counted[#counted] or 0) * P
  local rem = presized(last)
  for p = 1, P do
    -- A later policy stops at the first refusal so far at the latest.
    upto = limits_batch_policy(cache.tables[p], policies[p], p, P, subjects, counted, upto, now,
      rem, after)
  end
  if upto <= #counted then
    -- Someone refused: every policy's states as they were before that request.
    for p = 1, P do
      limits_batch_rewind(cache, p, P, subjects, counted, upto, now, after)
    end
  end
  return upto, rem
end
