-- Rate limit, token bucket: holds at most CAPACITY tokens, refilled at RATE tokens
-- per second from the time elapsed; a request takes COST tokens. Allows bursts up
-- to CAPACITY and RATE per second on average.
-- KEYS[1]  hash {tokens = tokens left (a float), ts = time of that count in ms}
-- ARGV[1]  'take' (take COST tokens if there are enough) or 'refund' (give back COST)
-- ARGV[2]  now in ms. Production passes '' and the Redis clock (TIME) decides.
--          Tests pass a number to replay exact timings; a refund passes the `now`
--          that its take returned.
-- ARGV[3]  capacity   ARGV[4]  refill rate in tokens per second (may be fractional)
-- ARGV[5]  cost of this request
-- Returns {allowed (1, 0, or -1 when COST > CAPACITY can never be satisfied),
--          tokens remaining (whole), ms until the next request would be allowed,
--          ms until the bucket is full again, now in ms}.
-- A missing key reads as a full bucket, so the state is worthless once the bucket
-- could have refilled: it expires after twice the time to fill an empty bucket,
-- rounded up to whole ms and at least 1 ms (never a TTL of 0, which would delete
-- it at once). A denied request writes nothing.
local function clock()
  if ARGV[2] ~= '' then
    return tonumber(ARGV[2])
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

local now = clock()
local capacity = tonumber(ARGV[3])
local rate = tonumber(ARGV[4])
local cost = tonumber(ARGV[5])
local state = redis.call('HMGET', KEYS[1], 'tokens', 'ts')
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
  redis.call('HSET', KEYS[1], 'tokens', string.format('%.17g', t), 'ts',
             string.format('%d', math.max(now, ts)))
end

if ARGV[1] == 'refund' then
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
redis.call('PEXPIRE', KEYS[1], math.max(ttl, 1))
return {1, math.floor(tokens), ms_until(cost), ms_until(capacity), now}
