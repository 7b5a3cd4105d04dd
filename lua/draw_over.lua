-- Whether a drawn sale is over in Redis too: closed, or its end passed by the
-- Redis clock, as the purchase reads its window (lua/purchase_batch.lua). Once it
-- is, no purchase is taken any more, so who bought (the buyers or units hash) is
-- final and the running wins may be settled (src/sale/draw/pass.rs).
-- KEYS[1] meta hash
-- Returns 1 over, 0 still selling (a close is written to Redis after its commit),
-- -1 when the sale is not loaded or not trusted by this Redis run (its rebuild
-- first: the buyers it holds may be short).
local meta = redis.call('HMGET', KEYS[1], 'ends_ms', 'closed', 'run')
if not meta[1] or not same_run(meta[3]) then
  return -1
end
if meta[2] == '1' or clock_ms('') >= tonumber(meta[1]) then
  return 1
end
return 0
