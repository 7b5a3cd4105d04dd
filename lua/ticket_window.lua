-- Is a sale open now, by the Redis clock? For issuing purchase tickets (see
-- src/sale/ticket/window.rs): reads only, writes nothing.
-- KEYS[1] meta hash (starts_ms, ends_ms, closed, run)   KEYS[2] stock counter
-- ARGV[1] now in ms ('' = the Redis clock; tests replay exact timings)
-- Returns {code, value, now in ms}:
--   0 open (value = ms until it ends)   2 not started (value = ms to start)
--   3 ended or closed   4 not loaded (this Redis has no such sale)
--   6 recovering (the state is not trusted by this Redis run)
local meta = redis.call('HMGET', KEYS[1], 'starts_ms', 'ends_ms', 'closed', 'run')
local now = clock_ms(ARGV[1])
if not meta[1] then
  return {4, 0, now}
end
if not same_run(meta[4]) or redis.call('EXISTS', KEYS[2]) == 0 then
  return {6, 0, now}
end
if meta[3] == '1' or now >= tonumber(meta[2]) then
  return {3, 0, now}
end
local starts = tonumber(meta[1])
if now < starts then
  return {2, starts - now, now}
end
return {0, tonumber(meta[2]) - now, now}
