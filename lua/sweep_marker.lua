-- The sweep's note of which Redis run it last found whole: every sale and poll
-- checked (and rebuilt where needed) by a full pass that this run saw from start to
-- end. A restart or a failover (a new run id) or a wipe (the key gone) makes the next
-- periodic sweep a full pass again; otherwise it checks a few targets per tick.
-- KEYS[1] the marker
-- (Whether the marker names this run, each tick, is a GET the sweep compares
-- with the primaries' run ids it reads anyway: src/recover/sweep.rs, Sweep::whole.)
-- ARGV[1] 'begin': a full pass starts (the marker says so, naming this run and
--                  the pass)
--         'end':   the pass is over: the marker names this run when the mark
--                  this pass's 'begin' left is still there (no wipe, no restart and
--                  no other pass started meanwhile)
-- Returns ('begin' always 1):
--   1 marked   0 not marked (the pass's mark was gone)
-- ARGV[2] the pass's random token ('begin' and 'end')
local run = redis_run()
local mode = ARGV[1]
local marker = redis.call('GET', KEYS[1])
if mode == 'begin' then
  redis.call('SET', KEYS[1], 'pass:' .. run .. ':' .. ARGV[2])
  return 1
elseif mode == 'end' then
  if marker == 'pass:' .. run .. ':' .. ARGV[2] then
    redis.call('SET', KEYS[1], run)
    return 1
  end
  return 0
end
return redis.error_reply('sweep_marker.lua: unknown mode ' .. tostring(mode))
