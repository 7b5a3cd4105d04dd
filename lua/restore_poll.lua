-- Finish a poll's rebuild: every voter (settled, unsettled, already known) is in the
-- voters hash; options and tallies are written as counted from that union, and the
-- state is stamped with this Redis run, and with the rebuild's token as `rebuilt`
-- and no `changes` since (see lua/vote_batch.lua): a runoff counted before the
-- rebuild is never taken for one of the rebuilt ballots.
-- KEYS[1] meta hash   KEYS[2] options set   KEYS[3] tally hash   KEYS[4] rebuild token key
-- ARGV[1] token   ARGV[2] opens_ms   ARGV[3] closes_ms   ARGV[4] closed (0|1)
-- ARGV[5] n = number of options, then n option ids, then n counts (same order), then
-- the ballot settings (see lua/vote_batch.lua)
-- Returns the number of options, or -1 when the token is gone (start over).
if redis.call('GET', KEYS[4]) ~= ARGV[1] then
  return -1
end
local n = tonumber(ARGV[5])
redis.call('DEL', KEYS[2], KEYS[3])
for i = 1, n do
  redis.call('SADD', KEYS[2], ARGV[5 + i])
  local count = tonumber(ARGV[5 + n + i])
  if count > 0 then
    redis.call('HSET', KEYS[3], ARGV[5 + i], count)
  end
end
redis.call('HSET', KEYS[1], 'opens_ms', ARGV[2], 'closes_ms', ARGV[3], 'closed', ARGV[4],
  'ballot', ARGV[6 + 2 * n],
  'run', redis_run(), 'rebuilt', ARGV[1], 'changes', 0)
redis.call('DEL', KEYS[4])
return n
