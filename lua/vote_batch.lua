-- Decide a batch of votes of one poll atomically, each voter in order, with the vote
-- route's rate limits checked inside the decision (under the poll's hash tag).
-- KEYS[1] meta hash (opens_ms, closes_ms, closed, run)   KEYS[2] options set
-- KEYS[3] voters hash (user id -> option id)   KEYS[4] tally hash (option -> count)
-- KEYS[5] votes stream
-- KEYS[5 + p]: rate-limit policy p's key (a per-user policy's buckets are named
-- after it)   then per voter, one key per per-address policy: its state there
-- ARGV[1] poll id   ARGV[2] P, the number of policies   ARGV[3] now in ms ('' = the
-- Redis clock)   ARGV[4] unused ('')   ARGV[5 ..]: per policy: algorithm code, a, b,
-- c, subject ('u' per user, 'k' a key per voter; see lua/lib/batch.lua)
-- then per voter: user id, option id
-- Returns, per voter, code and value, and for codes 7 and 8 then per policy:
-- allowed, remaining, ms until allowed again, ms until the quota is back; for code
-- 0 per policy remaining and ms until the quota is back.
--   0 accepted (value = the option's new count)   1 already voted   2 not open yet
--   (value = ms to opening)   3 closed   4 not loaded (this Redis has no such poll)
--   5 unknown option   6 recovering (state not trusted by this Redis run)
--   7 rate limited (value = ms until allowed)   8 rate limit never satisfiable
--
-- The cost is per batch, not per voter, except for one XADD per accepted vote: one
-- HMGET asks about every voter, the voters hash is written once, each option's
-- tally read and written once, each limit key read and written once.
local ALREADY_VOTED, UNKNOWN_OPTION = 1, 5
local P, first_voter_arg, n = batch_shape()

local meta = redis.call('HMGET', KEYS[1], 'opens_ms', 'closes_ms', 'closed', 'run')
if not meta[1] then
  return batch_all(P, n, REPLY_NOT_LOADED)
end
if not same_run(meta[4]) then
  return batch_all(P, n, REPLY_RECOVERING)
end

local policies = batch_policies(P)
local now = clock_ms(ARGV[3])
local closed = meta[3] == '1' or now >= tonumber(meta[2])
local opens = tonumber(meta[1])

-- The limits and the window, item by item; who is left goes on to the decision.
local code, value, answers, asking, users = batch_admit(P, policies, first_voter_arg, n, now, closed,
  opens)

if #asking > 0 then
  local voted = batch_variadic('HMGET', KEYS[3], users)
  local is_option, tally = {}, {}
  local counted, new_voters = {}, {}
  for j, i in ipairs(asking) do
    local user = users[j]
    local option = ARGV[first_voter_arg + (i - 1) * 2 + 1]
    if is_option[option] == nil then
      is_option[option] = redis.call('SISMEMBER', KEYS[2], option) == 1
    end
    if not is_option[option] then
      code[i], value[i] = UNKNOWN_OPTION, 0
    elseif voted[j] or counted[user] then
      code[i], value[i] = ALREADY_VOTED, 0
    else
      if not tally[option] then
        tally[option] = {tonumber(redis.call('HGET', KEYS[4], option)) or 0, 0}
      end
      local t = tally[option]
      t[2] = t[2] + 1
      counted[user] = true
      new_voters[#new_voters + 1] = user
      new_voters[#new_voters + 1] = option
      redis.call('XADD', KEYS[5], '*', 'poll_id', ARGV[1], 'user_id', user, 'option_id', option,
        'at_ms', now)
      code[i], value[i] = REPLY_ACCEPTED, t[1] + t[2]
    end
  end
  if #new_voters > 0 then
    batch_variadic('HSET', KEYS[3], new_voters)
    for option, t in pairs(tally) do
      redis.call('HINCRBY', KEYS[4], option, t[2])
    end
  end
end

return batch_reply(P, n, code, value, answers)
