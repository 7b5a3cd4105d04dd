-- Shared by the batch decision scripts (lua/purchase_batch.lua, lua/vote_batch.lua),
-- whose ARGV start: id, P (number of policies), now override, then 4 per policy,
-- then two per item.

-- The batch's shape from ARGV: P policies, where the first item's two arguments
-- start, and the number of items.
local function batch_shape()
  local P = tonumber(ARGV[2])
  local first = 4 + 4 * P
  return P, first, (#ARGV - first + 1) / 2
end

-- The route's policies from ARGV: {algorithm code, a, b, c} each.
local function batch_policies(P)
  local policies = {}
  for p = 1, P do
    local at = 4 + (p - 1) * 4
    policies[p] = {ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]),
      tonumber(ARGV[at + 3])}
  end
  return policies
end

-- Appends one item's answer to `out`: code and value, then, only for the answers
-- that report them (0 accepted, 7 rate limited, 8 never satisfiable), per policy
-- allowed, remaining, ms until allowed, ms until reset (policies not asked:
-- allowed, zeros). Other answers (already bought, sold out, ...) are two numbers:
-- a storm's refusals cost Redis and the server no limit details nobody sends.
local function batch_answer(out, P, code, value, answers)
  local n = #out
  out[n + 1], out[n + 2] = code, value
  if code ~= 0 and code ~= 7 and code ~= 8 then
    return
  end
  n = n + 2
  for p = 1, P do
    local r = answers and answers[p]
    if r then
      out[n + 1], out[n + 2], out[n + 3], out[n + 4] = r[1], r[2], r[3], r[4]
    else
      out[n + 1], out[n + 2], out[n + 3], out[n + 4] = 1, 0, 0, 0
    end
    n = n + 4
  end
end

-- Item i's rate limits (its keys follow the script's state keys: the last n * P
-- keys are the items' limit keys), counted in `cache` (lua/lib/limits.lua: written
-- once at the end of the batch). Returns nil when every policy allowed it (and the
-- answers), else the refusal code and value: 7 and the wait in ms, or 8 (never
-- satisfiable).
local function batch_limits(cache, i, n, P, policies, now)
  if P == 0 then
    return nil, 0, nil
  end
  local first = #KEYS - n * P + 1
  local allowed, answers, wait = limits_take(cache, first + (i - 1) * P, policies, now)
  if allowed then
    return nil, 0, answers
  elseif wait == -1 then
    return 8, 0, answers
  end
  return 7, wait, answers
end

-- The first phase of a batch decision: each item's rate limits (counted all at
-- once, written once), then the window (closed: 3; not open until `opens`: 2 with
-- the ms to go). Returns per item code, value and policy answers (codes of the
-- items decided here), and the items left for the decision: their indexes and
-- their user ids (each item's first argument, from `first_arg`).
local function batch_admit(P, policies, first_arg, n, now, closed, opens)
  local cache = limits_cache()
  local code, value, answers = {}, {}, {}
  local asking, users = {}, {}
  for i = 1, n do
    local refused, wait, a = batch_limits(cache, i, n, P, policies, now)
    answers[i] = a
    if refused then
      code[i], value[i] = refused, wait
    elseif closed then
      code[i], value[i] = 3, 0
    elseif now < opens then
      code[i], value[i] = 2, opens - now
    else
      asking[#asking + 1] = i
      users[#users + 1] = ARGV[first_arg + (i - 1) * 2]
    end
  end
  limits_write(cache)
  return code, value, answers, asking, users
end

-- Every one of n items answered `code`, nothing decided or counted: the state is
-- missing or not trusted by this Redis run.
local function batch_all(P, n, code)
  local out = {}
  for _ = 1, n do
    batch_answer(out, P, code, 0, nil)
  end
  return out
end

-- Redis answers at most this many arguments to one command from a script at once
-- (Lua's unpack has a stack limit): variadic calls go in chunks of it.
local BATCH_CHUNK = 1000

-- redis.call(cmd, key, items...) in chunks; returns the replies, concatenated when
-- they are arrays.
local function batch_variadic(cmd, key, items)
  local out = {}
  for from = 1, #items, BATCH_CHUNK do
    local r = redis.call(cmd, key, unpack(items, from, math.min(from + BATCH_CHUNK - 1, #items)))
    if type(r) == 'table' then
      for _, v in ipairs(r) do
        out[#out + 1] = v
      end
    end
  end
  return out
end
