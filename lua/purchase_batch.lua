-- Decide a batch of purchases of one sale atomically, each buyer in order, with the
-- buy route's rate limits checked inside the decision (per user and per client
-- address, under the sale's hash tag).
-- KEYS[1] meta hash (starts_ms, ends_ms, closed, run, per_user)   KEYS[2] stock counter
-- KEYS[3] buyers set   KEYS[4] orders stream   KEYS[5] pending hash (order id -> user)
-- KEYS[6] units hash (user -> units held)   KEYS[7] units sold counter (KEYS[6] and
-- KEYS[7] are used only by a sale of more than one per customer)
-- KEYS[7 + (i - 1) * P + p]: buyer i's state for rate-limit policy p
-- ARGV[1] sale id   ARGV[2] P, the number of policies   ARGV[3] now in ms ('' = the
-- Redis clock; tests replay exact timings)
-- ARGV[4 ..]: per policy: algorithm code, a, b, c (see lua/lib/limits.lua)
-- then per buyer: user id, order id (`<uuid>`, or `<uuid>:<quantity>` for more
-- than one unit)
-- Returns, per buyer, code and value, and for codes 0, 7 and 8 then per policy:
-- allowed (1, 0, -1 never), remaining, ms until allowed again, ms until the quota
-- is back.
--   0 accepted (value = units left)   1 already bought   2 not started (value = ms
--   to start)   3 ended or closed   4 not loaded (this Redis has no such sale)
--   5 sold out   6 recovering (the state is not trusted by this Redis run)
--   7 rate limited (value = ms until allowed)   8 rate limit never satisfiable
--   9 over the per-customer cap (value = units the buyer holds)
--   10 fewer units left than asked for (value = units left; nothing taken)
--
-- A sale of one per customer (per_user absent or 1) decides with the buyers set:
-- SMISMEMBER, SADD, DECRBY. A sale of more keeps units per buyer (HMGET, HSET) and
-- the units sold (INCRBY), and takes a buyer's whole quantity or nothing.
-- A buyer refused by a limit is counted by no policy and touches no sale state.
-- When the sale is not loaded or not trusted, nothing is counted or decided.
--
-- The cost is per batch, not per buyer, except for one XADD per accepted order:
-- one SMISMEMBER asks about every buyer, and the buyers set, the stock and the
-- pending hash are written once each; each limit key is read and written once.
local ALREADY_BOUGHT, SOLD_OUT, OVER_CAP, NOT_ENOUGH_LEFT = 1, 5, 9, 10
local P, first_buyer_arg, n = batch_shape()

local meta = redis.call('HMGET', KEYS[1], 'starts_ms', 'ends_ms', 'closed', 'run', 'per_user')
if not meta[1] then
  return batch_all(P, n, REPLY_NOT_LOADED)
end
if not same_run(meta[4]) or redis.call('EXISTS', KEYS[2]) == 0 then
  -- Untrusted, or meta without stock (part of the state was lost): never guess.
  return batch_all(P, n, REPLY_RECOVERING)
end

local policies = batch_policies(P)
local now = clock_ms(ARGV[3])
local closed = meta[3] == '1' or now >= tonumber(meta[2])
local starts = tonumber(meta[1])

-- The window and the limits, buyer by buyer; who is left goes on to the sale.
-- The limits and the window, item by item; who is left goes on to the decision.
local code, value, answers, asking, users = batch_admit(P, policies, first_buyer_arg, n, now, closed,
  starts)

-- A sale of more than one per customer: units per buyer, all or nothing.
local function decide_units(per_user)
  local held = batch_variadic('HMGET', KEYS[6], users)
  local stock = tonumber(redis.call('GET', KEYS[2]))
  local taken = 0
  local now_held, changed, new_buyers, pending = {}, {}, {}, {}
  for j, i in ipairs(asking) do
    local user = users[j]
    local arg = ARGV[first_buyer_arg + (i - 1) * 2 + 1]
    local order, q = arg, 1
    local at = string.find(arg, ':', 1, true)
    if at then
      order, q = string.sub(arg, 1, at - 1), tonumber(string.sub(arg, at + 1))
    end
    local h = now_held[user] or tonumber(held[j]) or 0
    if h + q > per_user then
      code[i], value[i] = OVER_CAP, h
    elseif stock - taken <= 0 then
      code[i], value[i] = SOLD_OUT, 0
    elseif stock - taken < q then
      code[i], value[i] = NOT_ENOUGH_LEFT, stock - taken
    else
      taken = taken + q
      if h == 0 then
        new_buyers[#new_buyers + 1] = user
      end
      if not now_held[user] then
        changed[#changed + 1] = user
      end
      now_held[user] = h + q
      pending[#pending + 1] = order
      pending[#pending + 1] = user
      redis.call('XADD', KEYS[4], '*', 'order_id', order, 'sale_id', ARGV[1], 'user_id', user,
        'at_ms', now, 'quantity', q)
      code[i], value[i] = REPLY_ACCEPTED, stock - taken
    end
  end
  if taken > 0 then
    local units = {}
    for _, user in ipairs(changed) do
      units[#units + 1] = user
      units[#units + 1] = now_held[user]
    end
    batch_variadic('HSET', KEYS[6], units)
    if #new_buyers > 0 then
      batch_variadic('SADD', KEYS[3], new_buyers)
    end
    redis.call('DECRBY', KEYS[2], taken)
    redis.call('INCRBY', KEYS[7], taken)
    batch_variadic('HSET', KEYS[5], pending)
  end
end

local per_user = tonumber(meta[5]) or 1
if #asking > 0 and per_user > 1 then
  decide_units(per_user)
elseif #asking > 0 then
  local bought = batch_variadic('SMISMEMBER', KEYS[3], users)
  local stock = tonumber(redis.call('GET', KEYS[2]))
  local taken = 0
  local accepted, new_buyers, pending = {}, {}, {}
  for j, i in ipairs(asking) do
    local user = users[j]
    if bought[j] == 1 or accepted[user] then
      code[i], value[i] = ALREADY_BOUGHT, 0
    elseif #ARGV[first_buyer_arg + (i - 1) * 2 + 1] > 36 then
      -- More than one unit asked of a sale of one per customer.
      code[i], value[i] = OVER_CAP, 0
    elseif stock - taken <= 0 then
      code[i], value[i] = SOLD_OUT, 0
    else
      local order = ARGV[first_buyer_arg + (i - 1) * 2 + 1]
      taken = taken + 1
      accepted[user] = true
      new_buyers[#new_buyers + 1] = user
      pending[#pending + 1] = order
      pending[#pending + 1] = user
      redis.call('XADD', KEYS[4], '*', 'order_id', order, 'sale_id', ARGV[1], 'user_id', user,
        'at_ms', now)
      code[i], value[i] = REPLY_ACCEPTED, stock - taken
    end
  end
  if taken > 0 then
    batch_variadic('SADD', KEYS[3], new_buyers)
    redis.call('DECRBY', KEYS[2], taken)
    batch_variadic('HSET', KEYS[5], pending)
  end
end

return batch_reply(P, n, code, value, answers)
