-- An admin's edit of a poll that has not opened: its window and options, only
-- while nobody has voted (a poll that opened meanwhile and has a vote is refused,
-- and Postgres rolls back).
-- KEYS[1] meta hash   KEYS[2] options set   KEYS[3] voters hash
-- ARGV[1] opens_ms   ARGV[2] closes_ms   ARGV[3] ballot settings   ARGV[4..] option ids
-- Returns:
--   1 written   0 the poll has a vote   -1 not loaded (the rebuild from Postgres
--   writes all of it)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
if redis.call('HLEN', KEYS[3]) > 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'opens_ms', ARGV[1], 'closes_ms', ARGV[2], 'ballot', ARGV[3])
redis.call('DEL', KEYS[2])
for i = 4, #ARGV do
  redis.call('SADD', KEYS[2], ARGV[i])
end
return 1
