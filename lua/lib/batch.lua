-- Shared by the batch decision scripts (lua/purchase_batch.lua, lua/vote_batch.lua),
-- whose ARGV start: id, P (number of policies), now override, a number of the
-- script's own (the purchase: how long an idempotency key is remembered, in ms),
-- then 5 per policy (algorithm code, a, b, c, subject: 'u' per user, 'k' a key per
-- item), then two per item (the user id first). Their KEYS end with one key per
-- policy (its buckets are named after it, see limits_cache in lua/lib/limits.lua),
-- then per item one key per 'k' policy, in the policies' order: it names the
-- item's field in the policy's buckets (no script reads or writes such a key).

-- Reply codes every batch script shares; each script's header lists all of its own
-- codes with these (a Rust test reads the headers against the reply enums of
-- src/sale/buy.rs and src/vote/cast.rs).
local REPLY_ACCEPTED = 0
local REPLY_NOT_OPEN = 2
local REPLY_CLOSED = 3
local REPLY_NOT_LOADED = 4
local REPLY_RECOVERING = 6
local REPLY_LIMITED = 7
local REPLY_LIMIT_NEVER = 8
-- An answer given before, under the same idempotency key: code and value, then the
-- stored answer as one string (see lua/purchase_batch.lua).
local REPLY_REPLAYED = 11

-- The batch's shape from ARGV: P policies, where the first item's two arguments
-- start, and the number of items.
local function batch_shape()
  local P = tonumber(ARGV[2])
  local first = 5 + 5 * P
  return P, first, (#ARGV - first + 1) / 2
end

-- The route's policies from ARGV: {algorithm code, a, b, c, per user, take, taken,
-- reset per item} each, with the algorithm's take and its 202 numbers found once
-- per batch (limit_taker, limit_taken_of), not per request; `reset per item`: the
-- token bucket, whose reset after a take depends on the subject's state (every
-- other algorithm's is the batch's: see limits_batch_resets).
local function batch_policies(P)
  local policies = {}
  for p = 1, P do
    local at = 5 + (p - 1) * 5
    policies[p] = {ARGV[at], tonumber(ARGV[at + 1]), tonumber(ARGV[at + 2]),
      tonumber(ARGV[at + 3]), ARGV[at + 4] == 'u', limit_taker(ARGV[at]),
      limit_taken_of(ARGV[at]), ARGV[at] == 'tb'}
  end
  return policies
end

-- Appends one item's answer to `out`: code and value, then, only for the answers
-- that report them, per policy: for rate limited and never satisfiable, allowed,
-- remaining, ms until allowed, ms until reset (policies not asked: allowed, zeros);
-- for accepted, remaining, and ms until reset only for a policy whose reset is
-- per item (zeros here: an accepted item's come from limits_append_taken; the
-- others' reset is the batch's, at the reply's end: see batch_reply). Other
-- answers (already bought, sold out, ...) are two numbers: a storm's refusals cost
-- Redis and the server no limit details nobody sends. `out` holds n numbers
-- before; returns how many it holds after (the reply grows by index, not by
-- `#out`, which Lua computes by a search each time).
local function batch_answer(out, n, P, code, value, answers, policies)
  out[n + 1], out[n + 2] = code, value
  n = n + 2
  if code == REPLY_ACCEPTED then
    for p = 1, P do
      n = n + 1
      out[n] = 0
      if policies[p][8] then
        n = n + 1
        out[n] = 0
      end
    end
    return n
  end
  if code ~= REPLY_LIMITED and code ~= REPLY_LIMIT_NEVER then
    return n
  end
  for p = 1, P do
    local r = answers and answers[p]
    if r then
      out[n + 1], out[n + 2], out[n + 3], out[n + 4] = r[1], r[2], r[3], r[4]
    else
      out[n + 1], out[n + 2], out[n + 3], out[n + 4] = 1, 0, 0, 0
    end
    n = n + 4
  end
  return n
end

-- What the first phase decided on, for the replies that report the policies'
-- answers: the policies, the time, and per admitted item the P states its take was
-- decided on (kept only when a policy's 202 numbers read them: an algorithm other
-- than the sliding log and counter) and the P states it left (item i's at
-- (i - 1) * P + 1 ..; an item a later policy refused may have some of its places
-- written, never read). An item taken by limits_batch_take is in `fast`, its
-- remaining numbers in `rem` at the same places; its places in `after` hold what
-- limits_batch_rewind reads (a sliding counter's count, not its state), never read
-- for its reply. `all`: every item was taken so (none skipped, none refused), and
-- `fast` is left empty.
local batch_limits_seen = {policies = {}, now = 0, states = {}, after = {}, fast = {}}

-- The first phase of a batch decision: each item's rate limits (counted all at
-- once, written once), then the window (closed: REPLY_CLOSED; not open until
-- `opens`: REPLY_NOT_OPEN with the ms to go). Writes the code and value of each
-- item it answers into the caller's `code` and `value`; returns per item the
-- policy answers (of the items the limits refused; an admitted item's are computed
-- by batch_reply, only when its reply carries them), and the items left for the
-- decision: their indexes and their user ids (each item's first argument, from
-- `first_arg`), and whether those users are known to be distinct (true only when a
-- per-user policy counted every item and looked each user up once; false: perhaps
-- not). The limit keys end KEYS (see the top of this file). Items whose index
-- `skip` holds (answered already: a replay) are neither counted nor asking.
local function batch_admit(P, policies, first_arg, n, now, closed, opens, skip, code, value)
  local answers = {}
  local asking, users, left = {}, {}, 0
  -- after: per place, written before it is read (see batch_limits_seen).
  local seen, after, states, fast = {}, presized(n * P), {}, {}
  batch_limits_seen = {policies = policies, now = now, states = seen, after = after, fast = fast}
  -- Per counted item i, its subject per policy p at subjects[(i - 1) * P + p]: its
  -- user id (a per-user policy), or its address (its key of a per-address policy
  -- without the policy's prefix; see limits_cache).
  local cache, subjects
  -- A 202's numbers read the states before its take only for the algorithms other
  -- than the sliding log and counter (limits_append_taken).
  local before_read = false
  -- Every item counted and taken by limits_batch_take (the common batch).
  local all_taken = false
  if P > 0 then
    local keyed, per_user = 0, {}
    for p = 1, P do
      before_read = before_read or (policies[p][1] ~= 'sl' and policies[p][1] ~= 'sc')
      per_user[p] = policies[p][5]
      if not per_user[p] then
        keyed = keyed + 1
      end
    end
    local first_item_key = #KEYS - n * keyed + 1
    cache = limits_cache(policies, first_item_key - P, now)
    subjects = presized(n * P)
    -- An address's text, by its key: cut once per key and batch (a batch's items
    -- mostly come from few addresses).
    local address_of = {}
    -- (counted_users: the counted items' user ids, in order.)
    -- (Both presized, and cut to their length below.)
    local counted, counted_users, c = presized(n), presized(n), 0
    -- (Item i's first key, its subjects' first place less one and its user id's
    -- argument, kept from item to item.)
    local k, base, user_at = first_item_key, 0, first_arg
    for i = 1, n do
      if not (skip and skip[i]) then
        c = c + 1
        local user = ARGV[user_at]
        counted[c], counted_users[c] = i, user
        for p = 1, P do
          if per_user[p] then
            subjects[base + p] = user
          else
            local key = KEYS[k]
            local address = address_of[key]
            if not address then
              address = string.sub(key, cache.buckets[p].prefix + 1)
              address_of[key] = address
            end
            subjects[base + p] = address
            k = k + 1
          end
        end
      else
        k = k + keyed
      end
      base, user_at = base + P, user_at + 2
    end
    presized_cut(counted, c)
    presized_cut(counted_users, c)
    limits_preload(cache, policies, counted, subjects)
    -- The requests taken a policy at a time (lua/lib/limits_batch.lua): every one
    -- before counted[upto]; limits_take decides the others.
    local upto
    upto, batch_limits_seen.rem = limits_batch_take(cache, subjects, policies, counted, now, after)
    if upto > n then
      -- Every item taken (so none skipped): when the window is open, every one
      -- asks, in order, and no loop below is needed.
      all_taken = true
      batch_limits_seen.all = true
      if not closed and now >= opens then
        limits_write(cache)
        -- A per-user policy's subjects looked up (limits_preload): each user once.
        local distinct = false
        for p = 1, P do
          distinct = distinct or (per_user[p] and #cache.subjects[p] == c)
        end
        return answers, counted, counted_users, distinct
      end
    else
      for k = 1, upto - 1 do
        fast[counted[k]] = true
      end
    end
  end
  local before = before_read and seen or nil
  for i = 1, n do
    local admitted = skip and skip[i] or P == 0 or all_taken or fast[i]
    if not admitted then
      admitted = limits_take(cache, subjects, (i - 1) * P, policies, now, states, after, before)
    end
    if skip and skip[i] then
      -- Answered by the caller.
    elseif not admitted then
      local wait
      answers[i], wait = limits_answers(policies, states, now)
      if wait == -1 then
        code[i], value[i] = REPLY_LIMIT_NEVER, 0
      else
        code[i], value[i] = REPLY_LIMITED, wait
      end
    else
      if closed then
        code[i], value[i] = REPLY_CLOSED, 0
      elseif now < opens then
        code[i], value[i] = REPLY_NOT_OPEN, opens - now
      else
        left = left + 1
        asking[left], users[left] = i, ARGV[first_arg + (i - 1) * 2]
      end
    end
  end
  if cache then
    limits_write(cache)
  end
  return answers, asking, users, false
end

-- The script's reply: batch_answer per item, then per policy the ms until reset
-- of every request it took in this batch (limits_batch_resets; 0 for a policy
-- whose reset is per item, which each accepted item carries). An accepted item's
-- policy answers are computed here, from the states its take was decided on and
-- left (the answers its take would have given), straight into the reply. `texts`
-- (optional): per item, a string that follows its code and value (a replayed
-- answer's).
local function batch_reply(P, n, code, value, answers, texts)
  -- Sized for every item accepted (code, value and one per policy) and the
  -- resets; what is left over is cut below (the reply ends at its first nil).
  local out, seen, m = presized(n * (2 + P) + P), batch_limits_seen, 0
  local policies, before, after, now = seen.policies, seen.states, seen.after, seen.now
  local fast, rem, all = seen.fast, seen.rem, seen.all
  -- (Every item the limits took was taken by limits_batch_take.)
  local taken_all = P > 0 and all
  for i = 1, n do
    local a, c = answers[i], code[i]
    if c == REPLY_ACCEPTED and (taken_all or P > 0 and fast[i]) then
      -- Taken by limits_batch_take (sliding logs and counters only: no reset per
      -- item), its numbers with it. (Two policies, the shipped shapes, without a
      -- loop.)
      local at = (i - 1) * P
      if P == 2 then
        out[m + 1], out[m + 2], out[m + 3], out[m + 4] = c, value[i], rem[at + 1], rem[at + 2]
        m = m + 4
      else
        out[m + 1], out[m + 2] = c, value[i]
        m = m + 2
        for p = 1, P do
          out[m + p] = rem[at + p]
        end
        m = m + P
      end
    elseif c == REPLY_ACCEPTED and P > 0 and not a then
      out[m + 1], out[m + 2] = c, value[i]
      m = limits_append_taken(out, m + 2, policies, before, after, (i - 1) * P, now)
    else
      m = batch_answer(out, m, P, c, value[i], a, policies)
    end
    if texts and texts[i] then
      m = m + 1
      out[m] = texts[i]
    end
  end
  if P > 0 then
    local resets = limits_batch_resets(policies, now)
    for p = 1, P do
      out[m + p] = resets[p]
    end
    m = m + P
  end
  for j = m + 1, #out do
    out[j] = nil
  end
  return out
end

-- Every one of n items answered `code`, nothing decided or counted: the state is
-- missing or not trusted by this Redis run. (The resets at the end: zeros.)
local function batch_all(P, n, code)
  local out, m = {}, 0
  for _ = 1, n do
    m = batch_answer(out, m, P, code, 0, nil)
  end
  for p = 1, P do
    out[m + p] = 0
  end
  return out
end
