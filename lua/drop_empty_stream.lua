-- Removes a stream the settlement worker recreated (XGROUP CREATE ... MKSTREAM)
-- for a sale or poll that Postgres no longer lists: a rehearsal cleanup or a
-- deletion that committed between the worker's listing and its recreation. Only
-- a stream without entries goes, in one step, so an accepted order or vote is
-- never dropped (a stream with entries stays for the worker to settle).
-- KEYS[1] the stream
-- Returns 1 when it was removed, 0 when it has entries or is not there.
if redis.call('EXISTS', KEYS[1]) == 1 and redis.call('XLEN', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
