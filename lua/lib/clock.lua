-- The Redis server clock in ms, or `override` (tests replay exact timings with it;
-- production passes '' and Redis decides, so app servers with skewed clocks agree).
local function clock_ms(override)
  if override and override ~= '' then
    return tonumber(override)
  end
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
