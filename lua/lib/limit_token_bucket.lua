-- Rate limit, token bucket: holds at most `capacity` tokens, refilled at `rate`
-- tokens per second from the time elapsed; a request takes `cost` tokens. Allows
-- bursts up to the capacity and `rate` per second on average.
-- State: the key's text is "<tokens left, a float> <time of that count in ms>";
-- parsed, {tokens, time}. limit_token_bucket_read(text) is the parsed state, or nil
-- for none; limit_token_bucket_text(state) its text (lua/lib/limit_fixed_window.lua).
-- limit_token_bucket(state, now, capacity, rate, cost) returns
--   {allowed (1, 0, or -1 when cost > capacity can never be satisfied), tokens
--    remaining (whole), ms until the next request would be allowed, ms until the
--    bucket is full again, now in ms},
--   and, when allowed, the new state and its time to live in ms.
-- limit_token_bucket_undo(state, taken_at, capacity, rate, cost) gives back `cost`
-- tokens (never above capacity): the new state, or nil when there is no state.
-- A missing state reads as a full bucket, so the state is worthless once the bucket
-- could have refilled: it lives twice the time to fill an empty bucket, rounded up
-- to whole ms and at least 1 ms. A denied request writes nothing.
local function limit_token_bucket_read(text)
  local tokens, ts = string.match(text or '', '^(%S+) (%-?%d+)$')
  tokens, ts = tonumber(tokens), tonumber(ts)
  if tokens == nil or ts == nil then
    return nil
  end
  return {tokens, ts}
end

-- %.17g keeps every bit of the float, so repeated reads do not drift.
local function limit_token_bucket_text(state)
  return string.format('%.17g %d', state[1], state[2])
end

-- The tokens at `now` (refilled since the state's time), the state's time, and
-- whether there was a state (none reads as a full bucket).
local function limit_token_bucket_level(state, now, capacity, rate)
  if not state then
    return capacity, now, false
  end
  local tokens, ts = state[1], state[2]
  if now > ts then
    tokens = math.min(capacity, tokens + (now - ts) * rate / 1000)
  end
  return tokens, ts, true
end

local function limit_token_bucket(state, now, capacity, rate, cost)
  local tokens, ts = limit_token_bucket_level(state, now, capacity, rate)
  local function ms_until(n)
    if tokens >= n then
      return 0
    end
    return math.ceil((n - tokens) * 1000 / rate)
  end
  if cost > capacity then
    return {-1, math.floor(tokens), 0, ms_until(capacity), now}
  end
  if tokens < cost then
    return {0, math.floor(tokens), ms_until(cost), ms_until(capacity), now}
  end
  tokens = tokens - cost
  local ttl = math.max(2 * math.ceil(capacity * 1000 / rate), 1)
  return {1, math.floor(tokens), ms_until(cost), ms_until(capacity), now},
    {tokens, math.max(now, ts)}, ttl
end

local function limit_token_bucket_undo(state, taken_at, capacity, rate, cost)
  local tokens, ts, exists = limit_token_bucket_level(state, taken_at, capacity, rate)
  if not exists then
    return nil
  end
  return {math.min(capacity, tokens + cost), math.max(taken_at, ts)}
end
