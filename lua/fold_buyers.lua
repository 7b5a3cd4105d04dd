-- Moves up to ARGV[1] buyers of an earlier version's buyers set (KEYS[1], user
-- ids) into the buyers hash (KEYS[2], user -> the order that made them a buyer),
-- each as a buyer whose order it does not know (''), unless the hash has them
-- already (with their order). Atomic for each call, so no purchase or stock
-- change sees a buyer in neither. Once the set is empty, or when a sale Redis
-- holds (KEYS[3], its meta hash) has none, KEYS[1] becomes the marker string
-- (see src/sale/legacy.rs): a server of an earlier version then fails on the
-- sale instead of deciding against an empty set.
-- Returns how many it took from the set (0: none left).
local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'set' then
  local users = redis.call('SPOP', KEYS[1], ARGV[1])
  for _, user in ipairs(users) do
    redis.call('HSETNX', KEYS[2], user, '')
  end
  if redis.call('EXISTS', KEYS[1]) == 0 then
    redis.call('SET', KEYS[1], ARGV[2])
  end
  return #users
end
if kind == 'none' and redis.call('EXISTS', KEYS[3]) == 1 then
  redis.call('SET', KEYS[1], ARGV[2])
end
return 0
