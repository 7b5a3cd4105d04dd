-- Decide a batch of votes of one poll atomically, each voter in order, with the vote
-- route's rate limits checked inside the decision (under the poll's hash tag).
-- KEYS[1] meta hash (opens_ms, closes_ms, closed, run, ballot)   KEYS[2] options set
-- KEYS[3] voters hash (user id -> ballot, see below)   KEYS[4] tally hash (option ->
-- count)   KEYS[5] votes stream   KEYS[6] idempotency keys hash (`<user>:<key>` ->
-- `<ballot>|<code>:<value>:<text>`)
-- KEYS[6 + p]: rate-limit policy p's key (its buckets are named after it)   then
-- per voter, one key per per-address policy: the voter's field in its buckets
-- ARGV[1] poll id   ARGV[2] P, the number of policies   ARGV[3] now in ms ('' = the
-- Redis clock)   ARGV[4] ms the keys hash lives after its last write   ARGV[5 ..]:
-- per policy: algorithm code, a, b, c, subject ('u' per user, 'k' a key per voter;
-- see lua/lib/batch.lua)
-- then per voter: user id, ballot: `<option>` (single), `m<option>,<option>,...`
-- (multi), `r<option>,...` (ranked, in the order sent), `<option>*<count>` (budget),
-- each followed by
-- ` <idempotency key>` when the request had one
-- Returns, per voter, code and value, and for codes 7 and 8 then per policy:
-- allowed, remaining, ms until allowed, ms until the quota is back; for code
-- 0 per policy remaining, and ms until the quota is back only for a token bucket;
-- then, for codes 0 (except a first single ballot), 9, 10 and 11, a text. After the
-- voters, per policy the ms until the quota is back of every voter it took (0 for
-- a token bucket; see batch_reply in lua/lib/batch.lua).
--   0 accepted (value = the first choice's new count; text `<seq>:<replaced 0|1>:
--   <remaining>:<option remaining>`, the budget numbers 0 but in a budget poll)
--   1 already voted   2 not open yet (value = ms to opening)   3 closed   4 not
--   loaded (this Redis has no such poll)   5 unknown option   6 recovering (state not
--   trusted by this Redis run)   7 rate limited (value = ms until allowed)   8 rate
--   limit never satisfiable   9 budget spent (text `0:<option remaining>`)
--   10 over budget (value = remaining; text `<remaining>:<option remaining>`)
--   11 replayed (text: the key's first answer, `<code>:<value>:<text>`)
--   12 key used with another ballot   13 invalid ballot (a shape this poll's kind
--   does not take: the server checks first, so only a stale settings cache gets it)
--
-- The meta hash's `ballot` field: `<kind>:<max choices>:<votes per user>:<max per
-- option>:<allow change>`, kind s(ingle), m(ulti), b(udget), r(anked); absent: a
-- single ballot without changes (a poll made before ballot kinds).
-- Its `changes` field counts the batches that wrote a ballot (one HINCRBY a batch
-- that accepts): with the `rebuilt` field (the token of the rebuild that made the
-- state, see lua/restore_poll.lua) it names the voters hash's contents, the same
-- on every server, and a ranked poll's runoff is counted again when it moves
-- (src/vote/result.rs).
--
-- The voters hash holds each voter's ballot as it counts now: `<option>` (a first
-- single ballot, as before ballot kinds) or `<seq>|<ballot>`, seq the number of the
-- voter's accepted requests (1, 2, ...; it names the receipt, see
-- src/vote/receipt.rs), ballot `<option>,...` (single, multi, ranked) or
-- `<option>:<count>,...` (budget: votes spent per option). Tallies: single and
-- multi count each chosen option, ranked the first preference, budget the votes.
-- A replaced ballot leaves the tally and the new one enters it in this one script.
-- The batch's accepted requests are one stream entry: poll_id, at_ms and votes,
-- one record per accepted request, separated by spaces:
-- `<user>/<option>/<seq>/<count>/<choices>/<key>`, option the first choice, choices
-- the ballot of a multi or ranked vote (empty for single and budget), key the
-- Idempotency-Key (empty without one). (Entries of one vote each, with fields
-- user_id, option_id and the optional seq, choices, count and key, are an earlier
-- version's; src/vote/settlement.rs reads both.)
--
-- The cost is per batch, not per voter: one HMGET asks about every voter, the
-- voters hash is written once (and the meta hash's `changes` counted once), each option's tally read and written once, each
-- limit policy's states read with one HMGET or two and written with one HSET, and
-- one XADD carries every accepted request
-- (settlement reads, acknowledges and deletes them together).
local ALREADY_VOTED, UNKNOWN_OPTION, BUDGET_SPENT, OVER_BUDGET = 1, 5, 9, 10
local KEY_REUSED, INVALID_BALLOT = 12, 13
local REMEMBERED = {[REPLY_ACCEPTED] = true, [ALREADY_VOTED] = true, [BUDGET_SPENT] = true,
  [OVER_BUDGET] = true}
local P, first_voter_arg, n = batch_shape()

local meta = redis.call('HMGET', KEYS[1], 'opens_ms', 'closes_ms', 'closed', 'run', 'ballot')
if not meta[1] then
  return batch_all(P, n, REPLY_NOT_LOADED)
end
if not same_run(meta[4]) then
  return batch_all(P, n, REPLY_RECOVERING)
end
local kind, max_choices, budget, per_option, change = 's', 0, 0, 0, false
if meta[5] then
  local k, mc, b, po, c = string.match(meta[5], '^(%a):(%d+):(%d+):(%d+):(%d)$')
  kind, max_choices, budget, per_option, change = k, tonumber(mc), tonumber(b), tonumber(po),
    c == '1'
end

-- Each voter's ballot and key (nil without one): `idem[i]` the keys hash's field,
-- `key_of[i]` the key alone, for the stream record.
local ballots, idem, key_of = {}, {}, {}
local keyed = false
for i = 1, n do
  local at = first_voter_arg + (i - 1) * 2
  local arg = ARGV[at + 1]
  local space = string.find(arg, ' ', 1, true)
  if space then
    ballots[i] = string.sub(arg, 1, space - 1)
    key_of[i] = string.sub(arg, space + 1)
    idem[i] = ARGV[at] .. ':' .. key_of[i]
    keyed = true
  else
    ballots[i] = arg
  end
end

-- Keys remembered, and keys twice in this batch: answered now, or after the
-- decision (a repeat of a key first seen in this batch).
-- (`code` and `value` presized: every voter gets both before the reply.)
local code, value, texts = presized(n), presized(n), {}
local skip, first_of, stored = nil, {}, {}
if keyed then
  skip, first_of, stored = keys_load(n, idem, KEYS[6])
end

local replayed = false
local function replay(i, s)
  local bar = string.find(s, '|', 1, true)
  if string.sub(s, 1, bar - 1) ~= ballots[i] then
    code[i], value[i] = KEY_REUSED, 0
  else
    code[i], value[i], texts[i] = REPLY_REPLAYED, 0, string.sub(s, bar + 1)
    replayed = true
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
local opens = tonumber(meta[1])

-- The limits and the window, item by item; who is left goes on to the decision.
local answers, asking, users = batch_admit(P, policies,
  first_voter_arg, n, now, closed, opens, skip, code, value)

if #asking > 0 then
  local held = batch_variadic('HMGET', KEYS[3], users)
  local is_option, base, delta = {}, {}, {}
  local function known(option)
    if is_option[option] == nil then
      is_option[option] = redis.call('SISMEMBER', KEYS[2], option) == 1
    end
    return is_option[option]
  end
  local function add(option, d)
    delta[option] = (delta[option] or 0) + d
  end
  local function count_of(option)
    if base[option] == nil then
      base[option] = tonumber(redis.call('HGET', KEYS[4], option)) or 0
    end
    return base[option] + (delta[option] or 0)
  end
  -- A voter's ballot as this batch leaves it: {seq, ballot}; `order` lists them.
  local now_held, order = {}, {}
  local function current(j, user)
    local h = now_held[user]
    if h then
      return h[1], h[2]
    end
    local v = held[j]
    if not v then
      return 0, nil
    end
    local s, b = string.match(v, '^(%d+)|(.*)$')
    if s then
      return tonumber(s), b
    end
    return 1, v
  end
  local ordered = 0
  local function hold(user, seq, ballot)
    if not now_held[user] then
      ordered = ordered + 1
      order[ordered] = user
    end
    now_held[user] = {seq, ballot}
  end
  local function split(ballot)
    local ids = {}
    for id in string.gmatch(ballot, '[^,]+') do
      ids[#ids + 1] = id
    end
    return ids
  end
  local options_count = nil
  -- The batch's stream records, one per accepted request. A keyed vote's carries
  -- its key, so Postgres keeps it and a rebuild restores its answer.
  local records, recorded = {}, 0
  -- A number as text: `..` would make it with sprintf('%.14g') (Lua 5.1), about as
  -- dear as the rest of a record; a first ballot's count and sequence are 1.
  local function number_text(x)
    if x == 1 then
      return '1'
    end
    return string.format('%d', x)
  end
  local function record(i, user, option, seq, count, choices)
    local key = key_of[i] or ''
    recorded = recorded + 1
    records[recorded] = user .. '/' .. option .. '/' .. number_text(seq) .. '/' ..
      number_text(count) .. '/' .. choices .. '/' .. key
  end

  -- The voter's ballot count and ballot so far (0 and nil for none), or nil when
  -- they voted and may not change it (answered already voted).
  local function changing(i, j, user)
    local seq, old = current(j, user)
    if old and not change then
      code[i], value[i] = ALREADY_VOTED, 0
      return nil
    end
    return seq, old
  end

  -- A single ballot, its option: the checks and steps of a multi ballot of one
  -- option (decide_choices) without making a list of it and checking that for
  -- repeats, about 0.7 us of Redis per new voter (BENCHMARKS.md).
  local function decide_single(i, j, user)
    local option = ballots[i]
    if not string.match(option, '^[1-9]%d*$') then
      code[i], value[i] = INVALID_BALLOT, 0
      return
    end
    if not known(option) then
      code[i], value[i] = UNKNOWN_OPTION, 0
      return
    end
    local seq, old = changing(i, j, user)
    if not seq then
      return
    end
    if old then
      for _, id in ipairs(split(old)) do
        add(id, -1)
      end
    end
    add(option, 1)
    seq = seq + 1
    hold(user, seq, option)
    record(i, user, option, seq, 1, '')
    code[i], value[i] = REPLY_ACCEPTED, count_of(option)
    if seq > 1 then
      texts[i] = number_text(seq) .. (old and ':1:0:0' or ':0:0:0')
    end
  end

  -- A multi or ranked ballot, all or nothing: its kind's letter, then the options
  -- (`m7,9`, `r9,7`).
  local function decide_choices(i, j, user)
    local ballot = ballots[i]
    if string.sub(ballot, 1, 1) ~= kind then
      code[i], value[i] = INVALID_BALLOT, 0
      return
    end
    ballot = string.sub(ballot, 2)
    local ids = split(ballot)
    local limit = max_choices
    if limit <= 0 then
      options_count = options_count or redis.call('SCARD', KEYS[2])
      limit = options_count
    end
    if #ids < 1 or #ids > limit then
      code[i], value[i] = INVALID_BALLOT, 0
      return
    end
    local seen = {}
    for _, id in ipairs(ids) do
      if not string.match(id, '^[1-9]%d*$') or seen[id] then
        code[i], value[i] = INVALID_BALLOT, 0
        return
      end
      seen[id] = true
    end
    for _, id in ipairs(ids) do
      if not known(id) then
        code[i], value[i] = UNKNOWN_OPTION, 0
        return
      end
    end
    local seq, old = changing(i, j, user)
    if not seq then
      return
    end
    local replaced = 0
    if old then
      replaced = 1
      local old_ids = split(old)
      if kind == 'r' then
        add(old_ids[1], -1)
      else
        for _, id in ipairs(old_ids) do
          add(id, -1)
        end
      end
    end
    if kind == 'r' then
      add(ids[1], 1)
    else
      for _, id in ipairs(ids) do
        add(id, 1)
      end
    end
    seq = seq + 1
    hold(user, seq, ballot)
    record(i, user, ids[1], seq, 1, ballot)
    code[i], value[i] = REPLY_ACCEPTED, count_of(ids[1])
    texts[i] = number_text(seq) .. (replaced == 1 and ':1:0:0' or ':0:0:0')
  end

  -- A budget vote: spent whole, or not at all.
  local function decide_budget(i, j, user)
    local option, count = string.match(ballots[i], '^([1-9]%d*)%*([1-9]%d*)$')
    if not option then
      code[i], value[i] = INVALID_BALLOT, 0
      return
    end
    count = tonumber(count)
    if not known(option) then
      code[i], value[i] = UNKNOWN_OPTION, 0
      return
    end
    local seq, old = current(j, user)
    local spent, total, parts = {}, 0, {}
    if old then
      for o, c in string.gmatch(old, '(%d+):(%d+)') do
        spent[o] = tonumber(c)
        total = total + spent[o]
        parts[#parts + 1] = o
      end
    end
    local remaining = budget - total
    local option_remaining = math.min(per_option - (spent[option] or 0), remaining)
    if remaining <= 0 then
      code[i], value[i], texts[i] = BUDGET_SPENT, 0, '0:0'
      return
    end
    if count > option_remaining then
      code[i], value[i], texts[i] = OVER_BUDGET, remaining, remaining .. ':' .. option_remaining
      return
    end
    if not spent[option] then
      parts[#parts + 1] = option
    end
    spent[option] = (spent[option] or 0) + count
    local pieces = {}
    for k, o in ipairs(parts) do
      pieces[k] = o .. ':' .. number_text(spent[o])
    end
    seq = seq + 1
    hold(user, seq, table.concat(pieces, ','))
    add(option, count)
    record(i, user, option, seq, count, '')
    remaining = remaining - count
    code[i], value[i] = REPLY_ACCEPTED, count_of(option)
    texts[i] = number_text(seq) .. ':0:' .. number_text(remaining) .. ':' ..
      number_text(math.min(per_option - spent[option], remaining))
  end

  for j = 1, #asking do
    local i = asking[j]
    if kind == 'b' then
      decide_budget(i, j, users[j])
    elseif kind == 's' then
      decide_single(i, j, users[j])
    else
      decide_choices(i, j, users[j])
    end
  end
  if ordered > 0 then
    local fields = presized(2 * ordered)
    for k = 1, ordered do
      local user = order[k]
      local h = now_held[user]
      fields[2 * k - 1] = user
      if h[1] == 1 and kind == 's' then
        fields[2 * k] = h[2]
      else
        fields[2 * k] = number_text(h[1]) .. '|' .. h[2]
      end
    end
    batch_variadic('HSET', KEYS[3], fields)
    redis.call('HINCRBY', KEYS[1], 'changes', 1)
    redis.call('XADD', KEYS[5], '*', 'poll_id', ARGV[1], 'at_ms', now, 'votes',
      table.concat(records, ' '))
    for option, d in pairs(delta) do
      if d ~= 0 then
        redis.call('HINCRBY', KEYS[4], option, d)
      end
    end
  end
end

-- Remember the decisions made for keys; answer a key's repeats in this batch.
if keyed then
  local function text_of(i)
    local c = code[i]
    if not REMEMBERED[c] then
      return nil
    end
    return ballots[i] .. '|' .. c .. ':' .. string.format('%d', value[i]) .. ':' .. (texts[i] or '')
  end
  -- A repeat in this batch with another ballot, its first not remembered (an
  -- unknown option): the key's use with another ballot, never the first's answer.
  local function reused(i, first)
    if ballots[i] == ballots[first] then
      return false
    end
    code[i], value[i] = KEY_REUSED, 0
    return true
  end
  keys_remember(n, idem, first_of, stored, KEYS[6], ARGV[4],
    {code = code, value = value, texts = texts, answers = answers}, text_of, replay, reused,
    function() return replayed end)
end

return batch_reply(P, n, code, value, answers, texts)
