-- Change fields of a sale's or poll's meta hash (window, closed) only when Redis
-- holds that state. A missing state is never half-created here: the rebuild from
-- Postgres writes all of it, with these fields as Postgres has them by then.
-- KEYS[1] meta hash   ARGV field, value, field, value, ...
-- Returns:
--   1 written   0 the state is missing
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], unpack(ARGV))
return 1
