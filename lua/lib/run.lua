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

-- A table whose array part already holds m slots (m at most 1,039, the length of
-- PRESIZE_TEXT; beyond, an empty table), each slot a number standing in for a
-- value: for an array the script fills at every place it later reads (item i's,
-- or (i - 1) * P + p), never tests a place for nil, and whose length it keeps
-- itself. Lua 5.1 grows a table filled from empty by doubling it, rehashing the
-- whole table each time, and puts the keys of places filled out of order (a
-- policy at a time: 1, 3, 5, ...) in its hash part first: Lua's key insertion and
-- its rehash took 13% of a purchase call's instructions, and making the batch's
-- arrays this way saved 3.7% of them (callgrind, BENCHMARKS.md).
-- `{string.byte(s, 1, m)}` makes the array at its size in one step, from a
-- constant compiled once with the script.
local PRESIZE_TEXT = [[
................................................................
................................................................
................................................................
................................................................
................................................................
................................................................
................................................................
................................................................
................................................................
................................................................
................................................................
................................................................
................................................................
................................................................
................................................................
................................................................]]
local function presized(m)
  if m < 1 or m > #PRESIZE_TEXT then
    return {}
  end
  return {string.byte(PRESIZE_TEXT, 1, m)}
end
