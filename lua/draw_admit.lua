-- Give a draw's winners their admission (their claim to buy, src/sale/draw/),
-- each once: a winner the given hash does not hold yet is added there and to the
-- open admissions, which the purchase checks and uses up (lua/purchase_batch.lua);
-- one it holds already (used up, or expired) is left as it is, so giving the same
-- wins again, from any server, changes nothing.
-- KEYS[1] meta hash   KEYS[2] open admissions (user -> claim end ms)
-- KEYS[3] admissions given (user -> claim end ms)
-- ARGV: pairs of user id, claim end (ms)
-- Returns the number newly admitted, or -1 when the sale is not loaded or not
-- trusted by this Redis run (its rebuild gives the wins from Postgres).
local run = redis.call('HGET', KEYS[1], 'run')
if not run or not same_run(run) then
  return -1
end
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HSETNX', KEYS[3], ARGV[i], ARGV[i + 1]) == 1 then
    redis.call('ZADD', KEYS[2], ARGV[i + 1], ARGV[i])
    n = n + 1
  end
end
return n
