-- Runs the rate-limit algorithms (lua/lib/limit_*.lua) against Redis: one policy by
-- algorithm code, 'fw' fixed window, 'sl' sliding log, 'sc' sliding counter, 'tb'
-- token bucket; a, b, c: limit and window ms, or capacity, refill rate per second
-- and cost.
--
-- A policy's state for one subject is text: in lua/limit.lua (the routes limited
-- outside a decision) a string key of its own, read once (GET) and written once
-- (SET with PX, so no key is ever left without an expiry); in the batch scripts
-- (buy, vote) a field of the policy's bucket hash of the time span (limits_cache
-- below: a batch's subjects read with one HMGET or two, written with one HSET).
-- Either way it is parsed once (limit_*_read) and, when something counted,
-- formatted and written once (limit_*_text), however many requests count in it:
-- the algorithms compute on parsed state (a batch's requests from one address
-- share one counter).

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

-- A policy's take, found once per batch rather than per request: (state, now, a,
-- b, c) -> the new state and its time to live when one more request fits, else
-- nil. The algorithm's own take, or its full decision for the others. A take never
-- changes the state it is given and never gives it back: limits_write tells a
-- counted subject by its state no longer being the one read (held by
-- tests/api/limit.rs, a_take_that_counts_makes_a_new_state_and_leaves_the_one_it_read).
local function limit_taker(alg)
  return LIMIT_TAKE[alg] or function(state, now, a, b, c)
    local r, new_state, ttl = limit_decide(alg, state, now, a, b, c)
    if r[1] == 1 then
      return new_state, ttl
    end
    return nil
  end
end

-- A policy's numbers for a request it took, (before, after, now, a, b, c) ->
-- remaining, reset (see limits_append_taken), found once per batch: the sliding
-- log and counter read them off the state after the take, the others decide again
-- on the state before it.
local function limit_taken_of(alg)
  if alg == 'sl' then
    return limit_sliding_log_taken
  elseif alg == 'sc' then
    return limit_sliding_counter_taken
  end
  return function(before, _, now, a, b, c)
    local r = limit_decide(alg, before or nil, now, a, b, c)
    return r[2], r[4]
  end
end

-- How long a policy's state matters after its last write, in ms: at most the time
-- to live the algorithm gives it (see lua/lib/limit_*.lua).
local function limit_span(alg, a, b, c)
  if alg == 'sl' or alg == 'fw' then
    return b
  elseif alg == 'sc' then
    return 2 * b
  elseif alg == 'tb' then
    return math.max(2 * math.ceil(a * 1000 / b), 1)
  end
  error('unknown rate-limit algorithm ' .. tostring(alg))
end

-- The policies' state as a batch script sees it, per policy p: `tables[p]` maps a
-- subject (a user id, or an address's text) to its parsed state (false for none),
-- read once by limits_preload (`subjects[p]` lists them, `read[p]` their states as
-- read, in the same order); its changes are kept there and written once by
-- limits_write: a subject's state is written when it is no longer the one read.
--
-- Every policy keeps its subjects' states in buckets: hashes named after the
-- policy's key (KEYS[first_policy_key + p - 1]) and the number of the span
-- (limit_span) `now` falls in, one field per subject. A per-user policy's key is
-- its buckets' base as it is (it ends in `b`, see src/batch/call.rs); a
-- per-address policy's key is the prefix of its items' keys (`...:rl:buy-ip:`), to
-- which `b` is added: an item's key names its field (the key without the prefix:
-- the address as src/limit/client.rs wrote it), never a key read or written.
-- A fresh buyer thus costs Redis a field in a hash per policy, written with the
-- batch's other fields by one HSET, instead of a key of its own with an expiry (a
-- SET each, its own expiry to track and delete later, and a call into Redis per
-- key from the script): buyers from many addresses cost about what buyers from
-- one do (docs/rate-limits.md, "State in buckets").
-- A state written in span b no longer counts by the end of span b + 1 (its time to
-- live is at most a span), so a subject's state is the field in the current
-- bucket, else the one in the previous bucket; a bucket two spans old is deleted
-- with UNLINK (freed off Redis's main thread) by the first batch that writes the
-- current one, and every bucket expires three spans after its start anyway. That
-- first batch also writes field `#` (no user id or address looks like it), which
-- tells the later ones that the bucket's expiry is set: they send neither PEXPIRE
-- nor UNLINK. A clock replayed backwards (tests) across a span would miss the
-- later bucket.
--
-- The buckets' names of the last call, per policy: {key, span number, current,
-- previous, stale, per user}, kept from call to call (this library's locals live
-- as long as it does in this Redis; a policy's names change once a span, or with
-- the sale). A name made anew turns the span's number into text (`..` on a number
-- is sprintf's '%.14g' in Lua 5.1, about 3,000 instructions), three a policy and
-- call.
local limits_bucket_names = {}
local function limits_cache(policies, first_policy_key, now)
  local c = {tables = {}, read = {}, policies = policies, buckets = {}, now = now}
  for p, policy in ipairs(policies) do
    c.tables[p] = {}
    local span = limit_span(policy[1], policy[2], policy[3], policy[4])
    local b = math.floor(now / span)
    local key = KEYS[first_policy_key + p - 1]
    local names = limits_bucket_names[p]
    if not names or names[1] ~= key or names[2] ~= b or names[6] ~= policy[5] then
      local base = key
      if not policy[5] then
        base = key .. 'b'
      end
      names = {key, b, base .. b, base .. (b - 1), base .. (b - 2), policy[5]}
      limits_bucket_names[p] = names
    end
    -- (`ends`: when the bucket's expiry falls, three spans after its start.)
    c.buckets[p] = {current = names[3], previous = names[4], stale = names[5],
      ends = (b + 3) * span, prefix = #key}
  end
  return c
end

-- Reads `ids` (distinct subjects) of a policy from its bucket `key` (HMGET) into
-- `t`; returns those not found, when `list_missing`.
local function limits_read(t, read, key, ids, list_missing)
  -- (`missing` made at the first subject not found, presized for it and every one
  -- after, and cut below to what it holds.)
  local missing, m = nil, 0
  for from = 1, #ids, BATCH_CHUNK do
    local to = math.min(from + BATCH_CHUNK - 1, #ids)
    local texts = redis.call('HMGET', key, unpack(ids, from, to))
    for j = 1, to - from + 1 do
      local text = texts[j]
      if text then
        t[ids[from + j - 1]] = read(text) or false
      elseif list_missing then
        if not missing then
          missing = presized(#ids - (from + j - 1) + 1)
        end
        m = m + 1
        missing[m] = ids[from + j - 1]
      end
    end
  end
  if not missing then
    return {}
  end
  return presized_cut(missing, m)
end

-- Reads the states of the batch's items `items` (indexes, from 1) into `cache`:
-- per policy, one HMGET of the current bucket and one of the previous for the
-- subjects not in it. Item i's subject under policy p is subjects[(i - 1) * P + p]
-- (see batch_admit).
local function limits_preload(cache, policies, items, subjects)
  local P = #policies
  local wanted = {}
  for p = 1, P do
    local t, w, c = cache.tables[p], {}, 0
    for k = 1, #items do
      local id = subjects[(items[k] - 1) * P + p]
      if t[id] == nil then
        t[id] = false
        c = c + 1
        w[c] = id
      end
    end
    wanted[p] = w
  end
  for p = 1, P do
    local read = LIMIT_READ[policies[p][1]]
    if not read then
      error('unknown rate-limit algorithm ' .. tostring(policies[p][1]))
    end
    local t, bucket = cache.tables[p], cache.buckets[p]
    if #wanted[p] > 0 then
      -- Field `#` marks a bucket set up (its expiry set, the stale one gone): asked
      -- with the subjects, in the same HMGET.
      local w = wanted[p]
      w[#w + 1] = '#'
      local missing = limits_read(t, read, bucket.current, w, true)
      w[#w] = nil
      t['#'] = nil
      if missing[#missing] == '#' then
        missing[#missing] = nil
      else
        bucket.ready = true
      end
      if #missing > 0 then
        limits_read(t, read, bucket.previous, missing, false)
      end
    end
    -- The states as read, by subject's place in wanted[p]: limits_write writes the
    -- subjects whose state is no longer the one read.
    local w = wanted[p]
    local read_states = presized(#w)
    for k = 1, #w do
      read_states[k] = t[w[k]]
    end
    cache.read[p] = read_states
  end
  cache.subjects = wanted
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
-- request every policy took, as limits_answers gives them on the states before
-- it: its remaining, and its ms until reset only for a policy whose reset is per
-- item (policy[8], the token bucket); every other policy's reset after a take is
-- the batch's (limits_batch_resets), sent once at the reply's end. An allowed
-- request's answer is read for its RateLimit header only, never for a
-- Retry-After, so neither its verdict (allowed) nor its wait is sent (the wait was
-- most of the work: a sliding counter's first fit, a full log's entry). The
-- sliding log and counter read remaining off the states after it instead of
-- deciding again, and without a table per answer; the other algorithms decide
-- again. `before` and `after` hold the request's states at from + 1 .. from + P.
-- Returns the index of the last number.
local function limits_append_taken(out, n, policies, before, after, from, now)
  for p = 1, #policies do
    local policy = policies[p]
    local remaining, reset = policy[7](before[from + p], after[from + p], now, policy[2],
      policy[3], policy[4])
    n = n + 1
    out[n] = remaining
    if policy[8] then
      n = n + 1
      out[n] = reset
    end
  end
  return n
end

-- Per policy, the ms until reset of every request it takes at `now`, whoever the
-- subject (0 for a policy whose reset is per item, the token bucket's): the
-- sliding log's window; the sliding counter's, two windows less the time into the
-- current one (a take leaves a count in the current window); the fixed window's,
-- what is left of the current one. limits_append_taken's reset for those, found
-- once per batch (held together by tests/api/limit_batch.rs).
local function limits_batch_resets(policies, now)
  local resets = {}
  for p = 1, #policies do
    local alg, window = policies[p][1], policies[p][3]
    if alg == 'sl' then
      resets[p] = window
    elseif alg == 'sc' then
      resets[p] = 2 * window - now % window
    elseif alg == 'fw' then
      resets[p] = window - now % window
    else
      resets[p] = 0
    end
  end
  return resets
end

-- Takes every policy for one request, all or nothing: when one refuses, none counts
-- it. Its subject under policy p is subjects[base + p] (a user id, or an
-- address: a field of the policy's buckets, see limits_cache); `policies`: {alg, a,
-- b, c, per user, take, taken} each (batch_policies); `cache` from limits_cache, the
-- states read by limits_preload (every subject of the batch's counted requests).
-- Fills `states[1..P]` with the states the request was decided on (false for none),
-- from which limits_answers gives a refusal's answers. When every policy took it,
-- returns true, with the states it left at after[base + 1 .. base + P] and, when
-- `before` is given, the states it was decided on at the same places (what
-- limits_append_taken reads); else false (`after` then holds what is never read).
local function limits_take(cache, subjects, base, policies, now, states, after, before)
  local tables, P = cache.tables, #policies
  for p = 1, P do
    local policy = policies[p]
    local state = tables[p][subjects[base + p]]
    states[p] = state
    local new_state = policy[6](state or nil, now, policy[2], policy[3], policy[4])
    if not new_state then
      -- The states of the policies not asked, for the refusal's answers.
      for q = p + 1, P do
        states[q] = tables[q][subjects[base + q]]
      end
      return false
    end
    after[base + p] = new_state
  end
  for p = 1, P do
    tables[p][subjects[base + p]] = after[base + p]
    if before then
      before[base + p] = states[p]
    end
  end
  return true
end

-- Writes every state the batch changed: per policy, its bucket's fields with one
-- HSET (and, by the bucket's first batch, its expiry; the bucket two spans old
-- goes). A take never gives back the state it was given (every algorithm's take
-- makes a new table, or a log that is longer or starts later: with a window of
-- 1 ms or more a stale entry dropped is never the `now` appended), so a state
-- that is not the one read is one a request counted in; a subject looked up for
-- nothing costs no write and no table of changes.
local function limits_write(cache)
  redis.set_repl(redis.REPL_NONE) -- see limit_set
  for p, policy in ipairs(cache.policies) do
    -- (A sliding log's state is its text: no call per subject to format it.)
    local text = policy[1] ~= 'sl' and LIMIT_TEXT[policy[1]]
    local t, bucket = cache.tables[p], cache.buckets[p]
    local ids, read_states = cache.subjects[p], cache.read[p]
    -- (`fields` made at the first subject to write, presized for it and every
    -- one after, and cut below to what was written.)
    local fields, f = nil, 0
    for k = 1, #ids do
      local id = ids[k]
      local state = t[id]
      if state and state ~= read_states[k] then
        if not fields then
          fields = presized(2 * (#ids - k + 1))
        end
        fields[f + 1], fields[f + 2] = id, text and text(state) or state
        f = f + 2
      end
    end
    if f > 0 then
      presized_cut(fields, f)
      if not bucket.ready then
        fields[f + 1], fields[f + 2] = '#', '1'
      end
      -- BATCH_CHUNK is even: a chunk never splits a field from its value.
      batch_variadic('HSET', bucket.current, fields)
      if not bucket.ready then
        redis.call('PEXPIRE', bucket.current, string.format('%d', bucket.ends - cache.now))
        redis.call('UNLINK', bucket.stale)
      end
    end
  end
  redis.set_repl(redis.REPL_ALL)
end
