-- Decide a batch of purchases of one sale atomically, each buyer in order, with the
-- buy route's rate limits checked inside the decision (per user and per client
-- address, under the sale's hash tag).
-- KEYS[1] meta hash (starts_ms, ends_ms, closed, run)   KEYS[2] stock counter
-- KEYS[3] buyers set   KEYS[4] orders stream   KEYS[5] pending hash (order id -> user)
-- KEYS[5 + (i - 1) * P + p]: buyer i's state for rate-limit policy p
-- ARGV[1] sale id   ARGV[2] P, the number of policies   ARGV[3] now in ms ('' = the
-- Redis clock; tests replay exact timings)
-- ARGV[4 ..]: per policy: algorithm code, a, b, c (see lua/lib/limits.lua)
-- then per buyer: user id, order id, request id
-- Returns, per buyer, 2 + 4 * P integers: code, value, then per policy: allowed
-- (1, 0, -1 never), remaining, ms until allowed again, ms until the quota is back.
--   0 accepted (value = units left)   1 already bought   2 not started (value = ms
--   to start)   3 ended or closed   4 not loaded (this Redis has no such sale)
--   5 sold out   6 recovering (the state is not trusted by this Redis run)
--   7 rate limited (value = ms until allowed)   8 rate limit never satisfiable
-- A buyer refused by a limit is counted by no policy and touches no sale state.
-- When the sale is not loaded or not trusted, nothing is counted or decided.
local P, first_buyer_arg, n = batch_shape()
local out = {}

local function answer(code, value, answers)
  batch_answer(out, P, code, value, answers)
end

local meta = redis.call('HMGET', KEYS[1], 'starts_ms', 'ends_ms', 'closed', 'run')
if not meta[1] then
  return batch_all(P, n, 4)
end
if not same_run(meta[4]) or redis.call('EXISTS', KEYS[2]) == 0 then
  -- Untrusted, or meta without stock (part of the state was lost): never guess.
  return batch_all(P, n, 6)
end

local policies = batch_policies(P)
local now = clock_ms(ARGV[3])
local closed = meta[3] == '1' or now >= tonumber(meta[2])
local starts = tonumber(meta[1])
local stock = tonumber(redis.call('GET', KEYS[2]))

for i = 1, n do
  local at = first_buyer_arg + (i - 1) * 3
  local user, order, request = ARGV[at], ARGV[at + 1], ARGV[at + 2]
  local refused, wait, answers = batch_limits(i, P, policies, now, request)
  if refused then
    answer(refused, wait, answers)
  elseif closed then
    answer(3, 0, answers)
  elseif now < starts then
    answer(2, starts - now, answers)
  elseif redis.call('SISMEMBER', KEYS[3], user) == 1 then
    answer(1, 0, answers)
  elseif stock <= 0 then
    answer(5, 0, answers)
  else
    redis.call('SADD', KEYS[3], user)
    stock = redis.call('DECR', KEYS[2])
    redis.call('HSET', KEYS[5], order, user)
    redis.call('XADD', KEYS[4], '*', 'order_id', order, 'sale_id', ARGV[1], 'user_id', user,
      'at_ms', now)
    answer(0, stock, answers)
  end
end
return out
