-- Decide a batch of votes of one poll atomically, each voter in order, with the vote
-- route's rate limits checked inside the decision (under the poll's hash tag).
-- KEYS[1] meta hash (opens_ms, closes_ms, closed, run)   KEYS[2] options set
-- KEYS[3] voters hash (user id -> option id)   KEYS[4] tally hash (option -> count)
-- KEYS[5] votes stream
-- KEYS[5 + (i - 1) * P + p]: voter i's state for rate-limit policy p
-- ARGV[1] poll id   ARGV[2] P, the number of policies   ARGV[3] now in ms ('' = the
-- Redis clock)   ARGV[4 ..]: per policy: algorithm code, a, b, c
-- then per voter: user id, option id, request id
-- Returns, per voter, 2 + 4 * P integers: code, value, then per policy: allowed,
-- remaining, ms until allowed again, ms until the quota is back.
--   0 accepted (value = the option's new count)   1 already voted   2 not open yet
--   (value = ms to opening)   3 closed   4 not loaded (this Redis has no such poll)
--   5 unknown option   6 recovering (state not trusted by this Redis run)
--   7 rate limited (value = ms until allowed)   8 rate limit never satisfiable
local P, first_voter_arg, n = batch_shape()
local out = {}

local function answer(code, value, answers)
  batch_answer(out, P, code, value, answers)
end

local meta = redis.call('HMGET', KEYS[1], 'opens_ms', 'closes_ms', 'closed', 'run')
if not meta[1] then
  return batch_all(P, n, 4)
end
if not same_run(meta[4]) then
  return batch_all(P, n, 6)
end

local policies = batch_policies(P)
local now = clock_ms(ARGV[3])
local closed = meta[3] == '1' or now >= tonumber(meta[2])
local opens = tonumber(meta[1])

for i = 1, n do
  local at = first_voter_arg + (i - 1) * 3
  local user, option, request = ARGV[at], ARGV[at + 1], ARGV[at + 2]
  local refused, wait, answers = batch_limits(i, P, policies, now, request)
  if refused then
    answer(refused, wait, answers)
  elseif closed then
    answer(3, 0, answers)
  elseif now < opens then
    answer(2, opens - now, answers)
  elseif redis.call('SISMEMBER', KEYS[2], option) == 0 then
    answer(5, 0, answers)
  elseif redis.call('HSETNX', KEYS[3], user, option) == 0 then
    answer(1, 0, answers)
  else
    local count = redis.call('HINCRBY', KEYS[4], option, 1)
    redis.call('XADD', KEYS[5], '*', 'poll_id', ARGV[1], 'user_id', user, 'option_id', option,
      'at_ms', now)
    answer(0, count, answers)
  end
end
return out
