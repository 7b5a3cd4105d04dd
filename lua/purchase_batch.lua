-- Decide a batch of purchases of one sale atomically, each buyer in order, with the
-- buy route's rate limits checked inside the decision (per user and per client
-- address, under the sale's hash tag), and each buyer's idempotency key remembered
-- with the decision.
-- KEYS[1] meta hash (starts_ms, ends_ms, closed, run, per_user)   KEYS[2] stock counter
-- KEYS[3] buyers hash (user -> the order that made them a buyer, see below)
-- KEYS[4] orders stream   KEYS[5] pending hash (see below)
-- KEYS[6] units hash (user -> units held)   KEYS[7] units sold counter (KEYS[6] and
-- KEYS[7] are used only by a sale of more than one per customer)
-- KEYS[8] idempotency keys hash (`<user>:<key>` -> `<quantity>:<code>:<value>:<order>`)
-- KEYS[9] admissions open (a sale with a waiting room: user -> expiry ms)
-- KEYS[9 + p]: rate-limit policy p's key (its buckets are named after it)   then
-- per buyer, one key per per-address policy: the buyer's field in its buckets
-- ARGV[1] sale id   ARGV[2] P, the number of policies   ARGV[3] now in ms ('' = the
-- Redis clock; tests replay exact timings)   ARGV[4] ms the keys hash lives after
-- its last write
-- ARGV[5 ..]: per policy: algorithm code, a, b, c, subject ('u' per user, 'k' a
-- key per buyer; see lua/lib/batch.lua and lua/lib/limits.lua)
-- then per buyer: user id, order id from its 15th character (`<id>`, 22
-- characters; `<id>:<quantity>` for more than one unit; `<id>:<quantity>:<idempotency
-- key>` with a key). An order id's first 14 characters are its sale's (the sale id
-- in its first six bytes, see src/sale/order_id.rs): the script makes them once
-- from ARGV[1]. Every order id of one call shares its batch tag (characters 15 to
-- 28 of the whole id, the first 14 of what a buyer's argument carries).
-- Returns, per buyer, code and value, and for codes 7 and 8 then per policy:
-- allowed (1, 0, -1 never), remaining, ms until allowed again, ms until the quota
-- is back; for code 0 per policy remaining, and ms until the quota is back only
-- for a token bucket (allowed, and its wait is not needed: see
-- limits_append_taken); for code 11 then the stored answer (a string); for code 1
-- then the order that makes the buyer one ('' when the buyers hash does not know
-- it: a buyer an earlier version's set held). After the buyers, per policy the ms
-- until the quota is back of every buyer it took (0 for a token bucket; see
-- batch_reply in lua/lib/batch.lua).
--   0 accepted (value = units left)   1 already bought   2 not started (value = ms
--   to start)   3 ended or closed   4 not loaded (this Redis has no such sale)
--   5 sold out   6 recovering (the state is not trusted by this Redis run)
--   7 rate limited (value = ms until allowed)   8 rate limit never satisfiable
--   9 over the per-customer cap (value = units the buyer holds)
--   10 fewer units left than asked for (value = units left; nothing taken)
--   11 replayed (the key's first answer follows as text)
--   12 key used with another quantity (value = the quantity it was first used with)
--   13 not admitted
--
-- A sale of one per customer (per_user absent or 1) decides with the buyers hash:
-- HMGET, HSET, DECRBY. A sale of more keeps units per buyer (HMGET, HSET) and the
-- units sold (INCRBY), and takes a buyer's whole quantity or nothing; its new
-- buyers join the buyers hash too (HSET).
-- A buyer refused by a limit is counted by no policy and touches no sale state.
-- When the sale is not loaded or not trusted, nothing is counted or decided.
--
-- Idempotency keys: a buyer with a key whose answer is remembered gets it again
-- (code 11), counted by no limit and touching nothing; the same key with another
-- quantity is code 12. A decision (accepted, already bought, sold out, over the
-- cap, not enough left) made for a keyed buyer is remembered in the keys hash
-- (at most one HMGET, one HSET and one PEXPIRE per batch that has keys), and an accepted
-- one's stream entry carries the key (`idem`), so Postgres keeps it on the order.
-- A batch that replays an acceptance refreshes the hash's expiry (PEXPIRE) even
-- when it remembers nothing new: that write is what lets a `WAIT` behind this call
-- (replica_acks) cover the replayed decision: from Redis 7.2 a client's
-- replication offset moves only with a command that wrote, so without it a replay
-- on a link that wrote nothing would be confirmed at once, whether or not a
-- replica has the first decision (7.0 moves it with every command).
-- The same key twice in one batch: the second gets the first's answer. A batch
-- without keys sends and runs no command for them.
--
-- The cost is per batch, not per buyer: one HMGET asks about every buyer, the
-- buyers hash and the stock are written once each, and the batch's accepted orders
-- are one stream entry (one XADD; settlement reads, acknowledges and deletes them
-- together) and one field of the pending hash; each limit policy's states are
-- read with one HMGET or two and written with one HSET, for the batch.
--
-- The pending hash holds the orders accepted and not yet settled, by batch: the
-- field is the batch tag, its value the entry's `orders` text (the same string as
-- the stream entry's; a second batch that drew the same tag appends to it, so a
-- tag never loses an order). Field `#` counts the orders the batch fields hold and
-- `#b` the batch fields; settlement takes both down (lua/settle_pending.lua) and
-- removes them at zero. Fields of 36 characters are an earlier version's (order id
-- -> user), counted by neither; src/sale/pending.rs reads both.
--
-- The buyers hash (KEYS[3]) holds every buyer of the sale, each with the order
-- that made them a buyer: one HMGET tells who bought already and which order an
-- `already_bought` names, without Postgres; one HSET per batch that accepts adds
-- the new buyers. It keeps an order id from its 15th character on (22 of 36: the
-- first 14 carry the sale id, which every order id of the sale shares, see
-- src/sale/order_id.rs): 32 bytes a value in Redis instead of 48. A value of ''
-- is a buyer whose order it does not know (from an earlier version's buyers set,
-- folded in by src/sale/legacy.rs). Until then a set said who bought and this
-- hash beside it named their orders: two tables to grow and look up per buyer
-- where one does (BENCHMARKS.md). A buyer who leaves (lua/stock_change.lua)
-- leaves the hash.
local ALREADY_BOUGHT, SOLD_OUT, OVER_CAP, NOT_ENOUGH_LEFT, KEY_REUSED, NOT_ADMITTED = 1, 5, 9, 10, 12, 13
-- The codes a key remembers, as text with their ':' (see the end of this script).
local CODE_TEXT = {[REPLY_ACCEPTED] = '0:', [ALREADY_BOUGHT] = '1:', [SOLD_OUT] = '5:',
  [OVER_CAP] = '9:', [NOT_ENOUGH_LEFT] = '10:'}
local P, first_buyer_arg, n = batch_shape()

local meta = redis.call('HMGET', KEYS[1], 'starts_ms', 'ends_ms', 'closed', 'run', 'per_user', 'wr')
if not meta[1] then
  return batch_all(P, n, REPLY_NOT_LOADED)
end
-- The stock, read once here: nothing else in this script changes it before the
-- decision does.
local stock_left = same_run(meta[4]) and redis.call('GET', KEYS[2])
if not stock_left then
  -- Untrusted, or meta without stock (part of the state was lost): never guess.
  return batch_all(P, n, REPLY_RECOVERING)
end

-- The first 14 characters of every order id of the sale (`%08x-%04x-` of the sale
-- id's six bytes, as src/sale/order_id.rs lays them out): an order id is
-- `order_prefix .. orders[i]`. The buyers hash keeps `orders[i]` as it came (see
-- below), so a buyer costs no string of its own here.
local sale_number = tonumber(ARGV[1])
local order_prefix = string.format('%08x-%04x-', (sale_number - sale_number % 65536) / 65536,
  sale_number % 65536)

-- Each buyer's order id from its 15th character, quantity and key (nil without
-- one); the quantity also as the text it came in, when it came (absent: 1), for
-- the stream entry and the answer remembered with a key.
-- (`key_of`: each keyed buyer's key alone, for its order's text in the entry.)
local orders, quantity, idem, quantity_text, key_of = presized(n), presized(n), {}, {}, {}
local keyed = false
-- (The buyer's argument, kept from buyer to buyer.)
local arg_at = first_buyer_arg + 1
for i = 1, n do
  local arg = ARGV[arg_at]
  arg_at = arg_at + 2
  if #arg == 22 then
    orders[i], quantity[i] = arg, 1
  else
    local q, key, units
    local c1, c2 = string.byte(arg, 24, 25)
    if c1 == 49 and c2 == 58 then
      -- `:1:<key>`, the usual keyed buyer: no pattern to match, no number to read.
      q, key, units = '1', string.sub(arg, 26), 1
    else
      q, key = string.match(arg, '^:(%d+):?(.*)$', 23)
      units = tonumber(q)
    end
    orders[i], quantity[i], quantity_text[i] = string.sub(arg, 1, 22), units, q
    if key and key ~= '' then
      -- (The buyer's user id: the argument before this one.)
      idem[i], key_of[i] = ARGV[arg_at - 3] .. ':' .. key, key
      keyed = true
    end
  end
end

-- Keys remembered, and keys twice in this batch: answered now, or after the
-- decision (a repeat of a key first seen in this batch).
-- (`code` and `value` presized: every buyer gets both before the reply.)
local code, value, texts = presized(n), presized(n), {}
local skip, first_of, stored = nil, {}, {}
if keyed then
  skip, first_of, stored = keys_load(n, idem, KEYS[8])
end

-- The answer to a buyer whose key has a remembered answer.
local replayed = false
local function replay(i, s)
  local q = tonumber(string.match(s, '^(%d+):'))
  if q ~= quantity[i] then
    code[i], value[i] = KEY_REUSED, q
  else
    code[i], value[i], texts[i] = REPLY_REPLAYED, 0, s
    -- An acceptance (code 0) given again: see the keys hash's expiry below.
    replayed = replayed or string.find(s, '^%d+:0:') ~= nil
  end
end
if keyed then
  for i = 1, n do
    if idem[i] and stored[idem[i]] then
      replay(i, stored[idem[i]])
    end
  end
end

local policies = batch_policies(P)
local now = clock_ms(ARGV[3])
local closed = meta[3] == '1' or now >= tonumber(meta[2])
local starts = tonumber(meta[1])

-- The limits and the window, item by item; who is left goes on to the decision.
local answers, asking, users, distinct = batch_admit(P, policies,
  first_buyer_arg, n, now, closed, starts, skip, code, value)

-- A sale with a waiting room (`wr` > 0) or a draw (`wr` = -1) sells only to
-- shoppers admitted and not expired (KEYS[9], see lua/queue_admit.lua and
-- lua/draw_admit.lua): `admitted[j]` for each buyer left; an accepted one's
-- admission is used up. (Someone who bought already is told so.)
local waiting_room = (tonumber(meta[6]) or 0) ~= 0
local admitted = nil
if waiting_room and #asking > 0 then
  admitted = {}
  local expiry = batch_variadic('ZMSCORE', KEYS[9], users)
  for j = 1, #users do
    local e = tonumber(expiry[j])
    admitted[j] = e ~= nil and e > now
  end
end

-- The batch's accepted orders, written as one stream entry (`record`, then
-- `append_entry` once): `sale_id`, `at_ms` (the time every order of the batch was
-- accepted) and `orders`, one `<order>:<user>:<quantity>[:<key>]` per order,
-- separated by spaces (a key has no space, and comes last).
-- `entry` holds the pieces of that text, joined once by table.concat (an order's
-- own text would be a string made, hashed and collected per buyer); `pieces` is
-- its length. An order's first piece is ' ' and the order prefix; append_entry
-- puts the prefix alone in the first order's place. (`entry` sized for buyers
-- without keys.)
local entry, pieces = presized(6 * n), 0
local prefix_after = ' ' .. order_prefix
local function record(i, user, q)
  entry[pieces + 1], entry[pieces + 2], entry[pieces + 3], entry[pieces + 4], entry[pieces + 5],
    entry[pieces + 6] = prefix_after, orders[i], ':', user, ':', q
  pieces = pieces + 6
  if idem[i] then
    entry[pieces + 1], entry[pieces + 2] = ':', key_of[i]
    pieces = pieces + 2
  end
end
-- (`count`: the entry's orders.)
local function append_entry(count)
  entry[1] = order_prefix
  local text = table.concat(entry, '', 1, pieces)
  redis.call('XADD', KEYS[4], '*', 'sale_id', ARGV[1], 'at_ms', now, 'orders', text)
  local tag = string.sub(orders[asking[1]], 1, 14)
  if redis.call('HSETNX', KEYS[5], tag, text) == 1 then
    redis.call('HINCRBY', KEYS[5], '#b', 1)
  else
    redis.call('HSET', KEYS[5], tag, redis.call('HGET', KEYS[5], tag) .. ' ' .. text)
  end
  redis.call('HINCRBY', KEYS[5], '#', count)
end

-- A sale of more than one per customer: units per buyer, all or nothing.
local function decide_units(per_user)
  local held = batch_variadic('HMGET', KEYS[6], users)
  local stock = tonumber(stock_left)
  local taken, accepted_orders = 0, 0
  local now_held, changed, new_buyers, held_of = {}, {}, {}, {}
  for j, i in ipairs(asking) do
    local user = users[j]
    local q = quantity[i]
    local h = now_held[user] or tonumber(held[j]) or 0
    if admitted and not admitted[j] then
      code[i], value[i] = NOT_ADMITTED, 0
    elseif h + q > per_user then
      code[i], value[i] = OVER_CAP, h
    elseif stock - taken <= 0 then
      code[i], value[i] = SOLD_OUT, 0
    elseif stock - taken < q then
      code[i], value[i] = NOT_ENOUGH_LEFT, stock - taken
    else
      taken = taken + q
      if h == 0 then
        new_buyers[#new_buyers + 1] = user
        held_of[#held_of + 1] = user
        held_of[#held_of + 1] = orders[i]
      end
      if not now_held[user] then
        changed[#changed + 1] = user
      end
      now_held[user] = h + q
      record(i, user, quantity_text[i] or '1')
      accepted_orders = accepted_orders + 1
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
      batch_variadic('HSET', KEYS[3], held_of)
    end
    redis.call('DECRBY', KEYS[2], taken)
    redis.call('INCRBY', KEYS[7], taken)
    append_entry(accepted_orders)
    if waiting_room then
      batch_variadic('ZREM', KEYS[9], new_buyers)
    end
  end
end

local per_user = tonumber(meta[5]) or 1
if #asking > 0 and per_user > 1 then
  decide_units(per_user)
elseif #asking > 0 then
  -- Each buyer's order that made them one (false: not a buyer).
  local bought = batch_variadic('HMGET', KEYS[3], users)
  local stock = tonumber(stock_left)
  local taken = 0
  -- (new_buyers: for a waiting room's admissions only. `accepted`, user -> the
  -- order this batch accepted, is needed only when a user may be in it twice.)
  local accepted = not distinct and {} or nil
  -- (`held_of`, user and order of each buyer accepted, presized at the first
  -- and cut to them below.)
  local new_buyers, held_of, b = {}, nil, 0
  -- (A numeric loop: Lua 5.1's ipairs calls into C for each item.)
  for j = 1, #asking do
    local i, user = asking[j], users[j]
    if accepted and accepted[user] then
      code[i], value[i], texts[i] = ALREADY_BOUGHT, 0, order_prefix .. accepted[user]
    elseif bought[j] then
      code[i], value[i] = ALREADY_BOUGHT, 0
      texts[i] = bought[j] ~= '' and order_prefix .. bought[j] or ''
    elseif admitted and not admitted[j] then
      code[i], value[i] = NOT_ADMITTED, 0
    elseif quantity[i] > 1 then
      -- More than one unit asked of a sale of one per customer.
      code[i], value[i] = OVER_CAP, 0
    elseif stock - taken <= 0 then
      code[i], value[i] = SOLD_OUT, 0
    else
      taken = taken + 1
      if accepted then
        accepted[user] = orders[i]
      end
      b = b + 1
      if b == 1 then
        held_of = presized(2 * (#asking - j + 1))
      end
      if waiting_room then
        new_buyers[b] = user
      end
      held_of[2 * b - 1], held_of[2 * b] = user, orders[i]
      if keyed and idem[i] then
        record(i, user, '1')
      else
        -- (record's work, without a call: an order of one unit, without a key.)
        entry[pieces + 1], entry[pieces + 2], entry[pieces + 3], entry[pieces + 4],
          entry[pieces + 5], entry[pieces + 6] = prefix_after, orders[i], ':', user, ':', '1'
        pieces = pieces + 6
      end
      code[i], value[i] = REPLY_ACCEPTED, stock - taken
    end
  end
  if taken > 0 then
    batch_variadic('HSET', KEYS[3], presized_cut(held_of, 2 * b))
    redis.call('DECRBY', KEYS[2], taken)
    append_entry(b)
    if waiting_room then
      batch_variadic('ZREM', KEYS[9], new_buyers)
    end
  end
end

-- Remember the decisions made for keys; answer a key's repeats in this batch.
if keyed then
  local function text_of(i)
    local c = code[i]
    if not CODE_TEXT[c] then
      return nil
    end
    -- Texts, not numbers, joined: Lua 5.1 turns a number into text with
    -- sprintf('%.14g') at each `..`, three a buyer here.
    return quantity_text[i] .. ':' .. CODE_TEXT[c] .. string.format('%d', value[i]) .. ':' ..
      (c == REPLY_ACCEPTED and order_prefix .. orders[i] or c == ALREADY_BOUGHT and texts[i] or '')
  end
  -- A repeat in this batch with another quantity, its first not remembered (a
  -- limit's refusal): the key's use with another quantity.
  local function reused(i, first)
    if quantity[i] == quantity[first] then
      return false
    end
    code[i], value[i] = KEY_REUSED, quantity[first]
    return true
  end
  keys_remember(n, idem, first_of, stored, KEYS[8], ARGV[4],
    {code = code, value = value, texts = texts, answers = answers}, text_of, replay, reused,
    function() return replayed end)
end

return batch_reply(P, n, code, value, answers, texts)
