-- Removes a poll nobody voted in from Redis, atomically with respect to votes.
-- KEYS[1] meta   KEYS[2] options   KEYS[3] voters   KEYS[4] tally
-- KEYS[5] votes stream   KEYS[6] rebuild token   KEYS[7] idempotency keys
-- Returns:
--   1 removed (or never there)   0 the poll has a vote
if redis.call('HLEN', KEYS[3]) > 0 then
  return 0
end
if redis.call('EXISTS', KEYS[5]) == 1 and redis.call('XLEN', KEYS[5]) > 0 then
  return 0
end
redis.call('DEL', unpack(KEYS))
return 1
