-- Apply one recorded stock change (a row of `stock_changes` in Postgres) exactly once.
-- The applied delta is remembered under the change id, so a retry after a crash
-- between Redis and Postgres answers the same delta instead of applying it twice.
-- KEYS[1] meta hash   KEYS[2] stock counter   KEYS[3] buyers hash (user -> order)
-- KEYS[4] applied changes hash (change id -> delta, or 'refused')
-- KEYS[5] units hash (user -> units held)   KEYS[6] units sold counter (both only on
-- a sale of more than one per customer)
-- ARGV[1] change id   ARGV[2] kind   ARGV[3] amount (>= 0)
-- ARGV[4] most units a sale may ever offer   ARGV[5] the buyer ('release' only)
-- Kinds:
--   'set'     units left become amount
--   'add'     units left grow by amount
--   'return'  an expired order's unit is offered again (its buyer stays a buyer and
--             may not buy again): units left grow by amount, never refused
--   'release' an expired order's unit goes back and its buyer may buy again: if the
--             buyer is still in the buyers hash, they leave it and units left grow by
--             amount (delta 0: units ever offered do not move); if not (a rebuild
--             from Postgres already left them out), nothing changes
-- Returns {code, delta, units left, units sold}:
--   0 applied (now or before)   1 refused: units ever offered would pass the maximum
--   4 not loaded   6 recovering (state not trusted by this Redis run)
local meta = redis.call('HMGET', KEYS[1], 'starts_ms', 'run')
if not meta[1] then
  return {4, 0, 0, 0}
end
if not same_run(meta[2]) then
  return {6, 0, 0, 0}
end
local left = redis.call('GET', KEYS[2])
if not left then
  return {6, 0, 0, 0}
end
left = tonumber(left)
local sold = sold_units(KEYS[6], KEYS[3])
local done = redis.call('HGET', KEYS[4], ARGV[1])
if done == 'refused' then
  return {1, 0, left, sold}
elseif done then
  return {0, tonumber(done), left, sold}
end
local amount = tonumber(ARGV[3])
local kind = ARGV[2]
if kind == 'release' then
  local units = redis.call('GET', KEYS[6])
  if units then
    -- Units per buyer: the buyer gives back `amount` of what they hold.
    local held = tonumber(redis.call('HGET', KEYS[5], ARGV[5]) or '0')
    local back = math.min(held, amount)
    if back > 0 then
      left = left + back
      sold = sold - back
      redis.call('SET', KEYS[2], left)
      redis.call('INCRBY', KEYS[6], -back)
      if held - back == 0 then
        redis.call('HDEL', KEYS[5], ARGV[5])
        redis.call('HDEL', KEYS[3], ARGV[5])
      else
        redis.call('HSET', KEYS[5], ARGV[5], held - back)
      end
    end
  elseif redis.call('HDEL', KEYS[3], ARGV[5]) == 1 then
    left = left + amount
    sold = sold - 1
    redis.call('SET', KEYS[2], left)
  end
  redis.call('HSET', KEYS[4], ARGV[1], 0)
  return {0, 0, left, sold}
end
local new_left = amount
if kind == 'add' or kind == 'return' then
  new_left = left + amount
end
if kind ~= 'return' and new_left + sold > tonumber(ARGV[4]) then
  redis.call('HSET', KEYS[4], ARGV[1], 'refused')
  return {1, 0, left, sold}
end
local delta = new_left - left
redis.call('SET', KEYS[2], new_left)
redis.call('HSET', KEYS[4], ARGV[1], delta)
return {0, delta, new_left, sold}
