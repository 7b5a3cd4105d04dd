-- Shared by the batch decision scripts (lua/purchase_batch.lua, lua/vote_batch.lua),
-- whose ARGV start: id, P (number of policies), now override, then 4 per policy.

-- The batch's shape from ARGV: P policies, where the first item's three arguments
-- start, and the number of items.
local function batch_shape()
  local P = tonumber(ARGV[2])
  local first = 4 + 4 * P
  return P, first, (#ARGV - first + 1) / 3
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

-- Appends one item's answer to `out`: code, value, then per policy allowed,
-- remaining, ms until allowed, ms until reset (policies not asked: allowed, zeros).
local function batch_answer(out, P, code, value, answers)
  out[#out + 1] = code
  out[#out + 1] = value
  for p = 1, P do
    local r = answers and answers[p] or {1, 0, 0, 0}
    out[#out + 1] = r[1]
    out[#out + 1] = r[2]
    out[#out + 1] = r[3]
    out[#out + 1] = r[4]
  end
end

-- Item i's rate limits. Returns nil when every policy allowed it (and the answers),
-- else the refusal code and value: 7 and the wait in ms, or 8 (never satisfiable).
local function batch_limits(i, P, policies, now, request_id)
  if P == 0 then
    return nil, 0, nil
  end
  local allowed, answers, wait = limits_take(6 + (i - 1) * P, policies, now, request_id)
  if allowed then
    return nil, 0, answers
  elseif wait == -1 then
    return 8, 0, answers
  end
  return 7, wait, answers
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
