-- Is a sale's or poll's state here and trusted by this Redis run? For the sweep that
-- rebuilds what a restart or a wipe left untrusted before anyone asks for it.
-- KEYS[1] meta hash   KEYS[2] a key the state cannot be without (a sale's stock
-- counter; for a poll, the options set)
-- Returns 0 trusted, 4 not loaded, 6 present but not trusted (or partly missing).
local stamp = redis.call('HGET', KEYS[1], 'run')
if redis.call('EXISTS', KEYS[1]) == 0 then
  return 4
end
if not same_run(stamp) or redis.call('EXISTS', KEYS[2]) == 0 then
  return 6
end
return 0
