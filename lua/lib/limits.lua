-- One rate-limit policy by algorithm code, for the decision scripts that check a
-- route's policies inside the decision: 'fw' fixed window, 'sl' sliding log,
-- 'sc' sliding counter, 'tb' token bucket. a, b, c: limit and window ms, or
-- capacity, refill rate per second and cost. Returns what the algorithm returns.
local function limit_apply(alg, key, mode, now, a, b, c, request_id)
  if alg == 'sl' then
    return limit_sliding_log(key, mode, now, a, b, request_id)
  elseif alg == 'sc' then
    return limit_sliding_counter(key, mode, now, a, b)
  elseif alg == 'fw' then
    return limit_fixed_window(key, mode, now, a, b)
  elseif alg == 'tb' then
    return limit_token_bucket(key, mode, now, a, b, c)
  end
  error('unknown rate-limit algorithm ' .. tostring(alg))
end

-- Takes every policy for one request; if any refuses, gives back what the others
-- took, so a refused request is counted by none. `first_key`: index in KEYS of
-- this request's first policy key; `policies`: {alg, a, b, c} each.
-- Returns allowed (true/false), the per-policy answers, and the largest wait (ms)
-- among the refusing policies (-1 when one can never be satisfied).
local function limits_take(first_key, policies, now, request_id)
  local answers = {}
  local refused, wait = false, 0
  for p, policy in ipairs(policies) do
    local r = limit_apply(policy[1], KEYS[first_key + p - 1], 'take', now,
      policy[2], policy[3], policy[4], request_id)
    answers[p] = r
    if r[1] ~= 1 then
      refused = true
      if r[1] == -1 or wait == -1 then
        wait = -1
      elseif r[3] > wait then
        wait = r[3]
      end
    end
  end
  if refused then
    for p, policy in ipairs(policies) do
      if answers[p][1] == 1 then
        limit_apply(policy[1], KEYS[first_key + p - 1], 'refund', answers[p][5],
          policy[2], policy[3], policy[4], request_id)
      end
    end
  end
  return not refused, answers, wait
end
