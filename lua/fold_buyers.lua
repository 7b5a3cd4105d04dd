-- Moves up to ARGV[1] buyers of an earlier version's buyers set (KEYS[1], user
-- ids) into the buyers hash (KEYS[2], user -> the order that made them a buyer),
-- each as a buyer whose order it does not know (''), unless the hash has them
-- already (with their order). Atomic for each call, so no purchase or stock
-- change sees a buyer in neither; the set is gone once empty.
-- Returns how many it took from the set (0: none left).
local users = redis.call('SPOP', KEYS[1], ARGV[1])
for _, user in ipairs(users) do
  redis.call('HSETNX', KEYS[2], user, '')
end
return #users
