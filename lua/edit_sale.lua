-- An admin's edit of a sale that has not opened: its window and its per-customer
-- cap, only while nobody has bought (a sale that opened meanwhile and sold keeps
-- what it sold under: the edit is refused and Postgres rolls back).
-- KEYS[1] meta hash   KEYS[2] buyers hash   KEYS[3] units sold counter
-- ARGV[1] starts_ms   ARGV[2] ends_ms   ARGV[3] most units per customer
-- ARGV[4] waiting room: admissions a second (0: none; -1: a draw)   ARGV[5] when its line opens
-- Returns:
--   1 written   0 the sale has buyers   -1 not loaded (the rebuild from Postgres
--   writes all of it)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
if redis.call('HLEN', KEYS[2]) > 0 or tonumber(redis.call('GET', KEYS[3]) or '0') > 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'starts_ms', ARGV[1], 'ends_ms', ARGV[2], 'per_user', ARGV[3],
  'wr', ARGV[4], 'q_opens_ms', ARGV[5])
if tonumber(ARGV[3]) > 1 then
  redis.call('SET', KEYS[3], 0)
else
  redis.call('DEL', KEYS[3])
end
return 1
