-- Removes a settlement consumer from a stream's group, only while it holds no
-- entry. The reclaim pass found it idle past claim_idle_ms with nothing pending,
-- but read that a moment ago, and a worker that stalled may have read since:
-- XGROUP DELCONSUMER would drop what it holds from the group's pending list, and
-- those orders would never be settled. Here the look and the removal are one step.
-- KEYS[1] the stream
-- ARGV[1] the group, ARGV[2] the consumer
-- Returns:
--   1 removed   0 it holds entries now
local held = redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2])
if #held > 0 then
  return 0
end
redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2])
return 1
