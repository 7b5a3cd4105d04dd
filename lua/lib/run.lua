-- Shared prelude (prepended at build time to every script that decides or rebuilds).
--
-- Which Redis process runs this script. The meta hash of a sale or poll carries, in
-- its `run` field, the run id of the Redis process that created, rebuilt or last
-- verified that state. A new process (a restart that may have lost the AOF's last
-- second, a failover to a replica that missed the tail, a restore from a backup) has
-- a new run id, and the state is not trusted until it is rebuilt from Postgres.
-- INFO costs about 4 us on Redis; it is read once per Lua state that runs this
-- library: once per call of a script (`EVAL`, whose whole body runs each time), and
-- once per process for a function library (the batch scripts, see src/lua.rs),
-- whose locals live as long as the library in this process (a restart or a
-- failover starts another process, whose library starts without it).
local run_id_read = nil
local function redis_run()
  if not run_id_read then
    -- (A plain find, not a pattern: a pattern is tried at every character before.)
    local info = redis.call('INFO', 'server')
    local at = string.find(info, 'run_id:', 1, true)
    run_id_read = string.sub(info, at + 7, at + 46)
  end
  return run_id_read
end

-- True when `stamp` (a meta hash's `run` field, or false when absent) names the
-- Redis process running this script.
local function same_run(stamp)
  return stamp ~= nil and stamp ~= false and stamp == redis_run()
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

-- An array made by presized for at most as many items as it holds, once filled
-- with its first m: the places after them emptied, so that `#`, ipairs and unpack
-- see those m items (a batch presizes for every item and keeps those it needs).
local function presized_cut(t, m)
  for x = m + 1, #t do
    t[x] = nil
  end
  return t
end
