-- Rate limit, token bucket: holds at most `capacity` tokens, refilled at `rate`
-- tokens per second from the time elapsed; a request takes `cost` tokens. Allows
-- bursts up to the capacity and `rate` per second on average.
-- key: hash {tokens = tokens left (a float), ts = time of that count in ms}
-- mode: 'take' (take `cost` tokens if there are enough) or 'refund' (give back
-- `cost`; pass the `now` that the take returned)
-- Returns {allowed (1, 0, or -1 when cost > capacity can never be satisfied),
-- tokens remaining (whole), ms until the next request would be allowed, ms until
-- the bucket is full again, now in ms}.
-- A missing key reads as a full bucket, so the state is worthless once the bucket
-- could have refilled: it expires after twice the time to fill an empty bucket,
-- rounded up to whole ms and at least 1 ms (never a TTL of 0, which would delete
-- it at once). A denied request writes nothing.
local function limit_token_bucket(key, mode, now, capacity, rate, cost)
  local state = redis.call('HMGET', key, 'tokens', 'ts')
  local tokens, ts = tonumber(state[1]), tonumber(state[2])
  local exists = tokens ~= nil and ts ~= nil
  if not exists then
    tokens, ts = capacity, now
  end
  if now > ts then
    tokens = math.min(capacity, tokens + (now - ts) * rate / 1000)
  end

  local function ms_until(n)
    if tokens >= n then
      return 0
    end
    return math.ceil((n - tokens) * 1000 / rate)
  end

  -- %.17g keeps every bit of the float, so repeated reads do not drift.
  local function save(t)
    redis.call('HSET', key, 'tokens', string.format('%.17g', t), 'ts',
               string.format('%d', math.max(now, ts)))
  end

  if mode == 'refund' then
    if exists then
      -- Keeps the key's expiry; never above capacity.
      tokens = math.min(capacity, tokens + cost)
      save(tokens)
    end
    return {1, math.floor(tokens), 0, ms_until(capacity), now}
  end

  if cost > capacity then
    return {-1, math.floor(tokens), 0, ms_until(capacity), now}
  end
  if tokens < cost then
    return {0, math.floor(tokens), ms_until(cost), ms_until(capacity), now}
  end
  tokens = tokens - cost
  save(tokens)
  local ttl = 2 * math.ceil(capacity * 1000 / rate)
  redis.call('PEXPIRE', key, math.max(ttl, 1))
  return {1, math.floor(tokens), ms_until(cost), ms_until(capacity), now}
end
