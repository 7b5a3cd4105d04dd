-- Shared prelude (prepended at build time to every script that decides or rebuilds).
--
-- Which Redis process runs this script. The meta hash of a sale or poll carries, in
-- its `run` field, the run id of the Redis process that created, rebuilt or last
-- verified that state. A new process (a restart that may have lost the AOF's last
-- second, a failover to a replica that missed the tail, a restore from a backup) has
-- a new run id, and the state is not trusted until it is rebuilt from Postgres.
-- INFO costs about 4 us on Redis; a batch of decisions pays it once.
local function redis_run()
  return string.match(redis.call('INFO', 'server'), 'run_id:(%x+)')
end

-- True when `stamp` (a meta hash's `run` field, or false when absent) names the
-- Redis process running this script.
local function same_run(stamp)
  if not stamp then
    return false
  end
  return string.find(redis.call('INFO', 'server'), 'run_id:' .. stamp, 1, true) ~= nil
end

-- Redis answers at most this many arguments to one command from a script at once
-- (Lua's unpack has a stack limit): variadic calls go in chunks of it.
local BATCH_CHUNK = 1000

-- redis.call(cmd, key, items...) in chunks; returns the replies, concatenated when
-- they are arrays. (Here, before lua/lib/limits.lua, which reads in chunks too.)
local function batch_variadic(cmd, key, items)
  if #items == 0 then
    return {}
  elseif #items <= BATCH_CHUNK then
    -- One call: its reply as it is (an array), not a copy of it.
    local r = redis.call(cmd, key, unpack(items))
    if type(r) == 'table' then
      return r
    end
    return {}
  end
  local out = {}
  for from = 1, #items, BATCH_CHUNK do
    local r = redis.call(cmd, key, unpack(items, from, math.min(from + BATCH_CHUNK - 1, #items)))
    if type(r) == 'table' then
      for _, v in ipairs(r) do
        out[#out + 1] = v
      end
    end
  end
  return out
end
