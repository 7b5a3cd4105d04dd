-- Runs the rate-limit algorithms (lua/lib/limit_*.lua) against Redis: one policy by
-- algorithm code, 'fw' fixed window, 'sl' sliding log, 'sc' sliding counter, 'tb'
-- token bucket; a, b, c: limit and window ms, or capacity, refill rate per second
-- and cost.
--
-- Every policy's state for one subject is one string key. A script reads and
-- parses it once (GET, or a batch's keys all with one MGET: limits_preload;
-- limit_*_read) and, when it counted something, formats and
-- writes it once (limit_*_text, SET with PX, so no key is ever left without an
-- expiry), however many of its requests count in that key: the algorithms compute
-- on parsed state (a batch's requests from one address share one counter).

-- Limit state is bookkeeping, not a decision: Redis keeps it in memory only, and
-- neither appends it to the AOF nor sends it to replicas (`redis.set_repl`). Under
-- `appendfsync always` any write in the AOF holds every reply of that event-loop
-- turn until an fsync, so a refused repeat buyer, whose script decides nothing,
-- would still wait for the disk only because its limit was counted. What a Redis
-- restart or a failover costs is the windows' recent counts (limits start afresh,
-- but for what an AOF rewrite or a snapshot happened to catch); never a unit, an
-- order or a vote. An expiring limit key is still deleted through the AOF (Redis
-- propagates expiries itself). Tested: tests/faults/limit_state.rs.
local function limit_set(key, text, ...)
  redis.set_repl(redis.REPL_NONE)
  redis.call('SET', key, text, ...)
  redis.set_repl(redis.REPL_ALL)
end

-- Each algorithm's parser and formatter of its state.
local LIMIT_READ = {
  sl = limit_sliding_log_read,
  sc = limit_sliding_counter_read,
  fw = limit_fixed_window_read,
  tb = limit_token_bucket_read,
}
local LIMIT_TEXT = {
  sl = limit_sliding_log_text,
  sc = limit_sliding_counter_text,
  fw = limit_fixed_window_text,
  tb = limit_token_bucket_text,
}

-- A key's parsed state under algorithm `alg`, or nil when there is none. A key of
-- another type (a hash or a sorted set left by an older Stampede) or text of
-- another layout reads as no state; the next write replaces it.
local function limit_load(key, alg)
  local read = LIMIT_READ[alg]
  if not read then
    error('unknown rate-limit algorithm ' .. tostring(alg))
  end
  local text = redis.pcall('GET', key)
  if type(text) ~= 'string' then
    return nil
  end
  return read(text)
end

-- Decides one request under one policy. Returns the answer {allowed, remaining,
-- wait ms, reset ms, now} and, when allowed, the new state and its time to live.
local function limit_decide(alg, state, now, a, b, c)
  if alg == 'sl' then
    return limit_sliding_log(state, now, a, b)
  elseif alg == 'sc' then
    return limit_sliding_counter(state, now, a, b)
  elseif alg == 'fw' then
    return limit_fixed_window(state, now, a, b)
  elseif alg == 'tb' then
    return limit_token_bucket(state, now, a, b, c)
  end
  error('unknown rate-limit algorithm ' .. tostring(alg))
end

-- Gives back one request counted at `taken_at`: the new state, or nil when there
-- is nothing to give back.
local function limit_undo(alg, state, taken_at, a, b, c)
  if alg == 'sl' then
    return limit_sliding_log_undo(state, taken_at)
  elseif alg == 'sc' then
    return limit_sliding_counter_undo(state, taken_at, b)
  elseif alg == 'fw' then
    return limit_fixed_window_undo(state, taken_at, b)
  elseif alg == 'tb' then
    return limit_token_bucket_undo(state, taken_at, a, b, c)
  end
  error('unknown rate-limit algorithm ' .. tostring(alg))
end

-- The limiter script of one policy (lua/limit.lua):
-- KEYS[1] the policy's state for one subject
-- ARGV[1] algorithm code   ARGV[2] 'take' or 'refund'   ARGV[3] now in ms ('' =
-- the Redis clock; a refund passes the `now` its take answered)   ARGV[4..6] a, b, c
-- A take returns the answer; a refund keeps the key's expiry and returns
-- {1, 0, 0, 0, now}.
local function limit_script()
  local key, alg, mode = KEYS[1], ARGV[1], ARGV[2]
  local now = clock_ms(ARGV[3])
  local a, b, c = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local state = limit_load(key, alg)
  if mode == 'refund' then
    local undone = limit_undo(alg, state, now, a, b, c)
    if undone then
      limit_set(key, LIMIT_TEXT[alg](undone), 'KEEPTTL')
    end
    return {1, 0, 0, 0, now}
  elseif mode ~= 'take' then
    error('unknown rate-limit mode ' .. tostring(mode))
  end
  local answer, new_state, ttl = limit_decide(alg, state, now, a, b, c)
  if new_state then
    limit_set(key, LIMIT_TEXT[alg](new_state), 'PX', ttl)
  end
  return answer
end

-- Each algorithm's take (lua/lib/limit_*.lua): whether one more request fits and
-- the new state, without the answer, which a batch computes only for the replies
-- that carry it. The fixed window and the token bucket take through their full
-- decision.
local LIMIT_TAKE = {
  sl = limit_sliding_log_take,
  sc = limit_sliding_counter_take,
}

-- One more request under one policy, when it fits: the new state and its time to
-- live, else nil.
local function limit_take(alg, state, now, a, b, c)
  local take = LIMIT_TAKE[alg]
  if take then
    return take(state, now, a, b, c)
  end
  local r, new_state, ttl = limit_decide(alg, state, now, a, b, c)
  if r[1] == 1 then
    return new_state, ttl
  end
  return nil
end

-- The policies' state as a batch script sees it: each key read once, by
-- limits_preload (its parsed state in `state`, false for none), its changes kept
-- here and written once by limits_write (`ttl` set for the keys a request counted
-- in).
local function limits_cache()
  return {state = {}, alg = {}, ttl = {}}
end

-- Reads the keys of the batch's items `items` (indexes, from 1) into `cache`, all
-- with one MGET (a GET per key costs Redis a command call each; a key of another
-- type reads as nil there, so as no state). `first_key`: index in KEYS of the first
-- item's first policy key.
local function limits_preload(cache, first_key, policies, items)
  local P = #policies
  local known, algs = cache.state, cache.alg
  local keys, key_alg = {}, {}
  for _, i in ipairs(items) do
    for p = 1, P do
      local key = KEYS[first_key + (i - 1) * P + p - 1]
      if known[key] == nil then
        known[key] = false
        keys[#keys + 1], key_alg[#keys + 1] = key, policies[p][1]
      end
    end
  end
  for from = 1, #keys, BATCH_CHUNK do
    local texts = redis.call('MGET', unpack(keys, from, math.min(from + BATCH_CHUNK - 1, #keys)))
    for j, text in ipairs(texts) do
      local k = from + j - 1
      local alg = key_alg[k]
      local read = LIMIT_READ[alg]
      if not read then
        error('unknown rate-limit algorithm ' .. tostring(alg))
      end
      algs[keys[k]] = alg
      if text then
        known[keys[k]] = read(text) or false
      end
    end
  end
end

-- The answers of every policy for one request, decided on `states` (its keys'
-- states before it, false for none), and the largest wait (ms) among the refusing
-- policies (-1 when one can never be satisfied).
local function limits_answers(policies, states, now)
  local answers, wait = {}, 0
  for p, policy in ipairs(policies) do
    local r = limit_decide(policy[1], states[p] or nil, now, policy[2], policy[3], policy[4])
    answers[p] = r
    if r[1] ~= 1 then
      if r[1] == -1 or wait == -1 then
        wait = -1
      elseif r[3] > wait then
        wait = r[3]
      end
    end
  end
  return answers, wait
end

-- Appends to `out`, from its index n + 1, the answers of every policy for a
-- request every policy took, four numbers each (allowed, remaining, wait, reset),
-- the same as limits_answers on the states before it: the sliding log and counter
-- read them off the states after it instead of deciding again, and without a table
-- per answer; the other algorithms decide again. `before` and `after` hold the
-- request's states at from + 1 .. from + P. Returns the index of the last number.
local function limits_append_taken(out, n, policies, before, after, from, now)
  for p, policy in ipairs(policies) do
    local alg = policy[1]
    local remaining, wait, reset
    if alg == 'sl' then
      remaining, wait, reset = limit_sliding_log_taken(after[from + p], now, policy[2],
        policy[3])
    elseif alg == 'sc' then
      remaining, wait, reset = limit_sliding_counter_taken(after[from + p], now, policy[2],
        policy[3])
    else
      local r = limit_decide(alg, before[from + p] or nil, now, policy[2], policy[3],
        policy[4])
      remaining, wait, reset = r[2], r[3], r[4]
    end
    out[n + 1], out[n + 2], out[n + 3], out[n + 4] = 1, remaining, wait, reset
    n = n + 4
  end
  return n
end

-- Scratch of limits_take: the new states and their times to live of one request.
local limits_new_state, limits_new_ttl = {}, {}

-- Takes every policy for one request, all or nothing: when one refuses, none counts
-- it. `first_key`: index in KEYS of this request's first policy key; `policies`:
-- {alg, a, b, c} each; `cache` from limits_cache, its keys read by limits_preload
-- (every key of the batch's counted requests). Fills `states[1..P]` with the
-- states the request was decided on (false for none), from which limits_answers
-- gives its answers. Returns true when every policy took it.
local function limits_take(cache, first_key, policies, now, states)
  local known, P = cache.state, #policies
  for p = 1, P do
    states[p] = known[KEYS[first_key + p - 1]]
  end
  for p = 1, P do
    local policy = policies[p]
    local new_state, ttl = limit_take(policy[1], states[p] or nil, now, policy[2], policy[3],
      policy[4])
    if not new_state then
      return false
    end
    limits_new_state[p], limits_new_ttl[p] = new_state, ttl
  end
  for p = 1, P do
    local key = KEYS[first_key + p - 1]
    known[key], cache.ttl[key] = limits_new_state[p], limits_new_ttl[p]
  end
  return true
end

-- Writes every key whose state the batch changed, with its expiry.
local function limits_write(cache)
  redis.set_repl(redis.REPL_NONE) -- see limit_set
  local state, alg = cache.state, cache.alg
  -- A batch's keys of one policy share their time to live: formatted once (Redis
  -- would format a Lua number with %.14g for each key).
  local ttl_text = {}
  for key, ttl in pairs(cache.ttl) do
    local px = ttl_text[ttl]
    if not px then
      px = string.format('%d', ttl)
      ttl_text[ttl] = px
    end
    redis.call('SET', key, LIMIT_TEXT[alg[key]](state[key]), 'PX', px)
  end
  redis.set_repl(redis.REPL_ALL)
end
