-- Units sold: a sale of one per customer counts its buyers; a sale of more keeps a
-- counter of units (`{sale:N}:sold`, present only on such sales).
local function sold_units(sold_key, buyers_key)
  local sold = redis.call('GET', sold_key)
  if sold then
    return tonumber(sold)
  end
  return redis.call('HLEN', buyers_key)
end
