-- Drops settled orders from a sale's pending hash (see lua/purchase_batch.lua),
-- after settlement wrote them to Postgres, and with KEYS[2] acknowledges and
-- deletes their stream entries in the same call.
-- KEYS[1] pending hash   KEYS[2] (optional) the stream the entries came from
-- With KEYS[2]: ARGV[1] the consumer group, ARGV[2] m, ARGV[3 .. 2 + m] the entry
-- ids; then (from ARGV[1] without KEYS[2]) one per settled stream entry, its
-- record: a batch entry's `orders` text (`<order>:<user>:<quantity>[:<key>]`,
-- separated by spaces, the same string the purchase script wrote to the batch's
-- field), or the order id of an earlier version's entry (one order, 36 characters).
-- Returns the number of orders dropped.
--
-- Why one call: under `appendfsync always` every event-loop turn that wrote ends
-- in an fsync, which holds Redis (about half a millisecond here) while purchases
-- wait. A settlement cycle wrote in three turns (the read, this drop, then
-- XACK and XDEL); the drop and the acknowledgement are now one, and atomic: the
-- entries go exactly when their orders leave the hash.
--
-- A batch field (the orders' batch tag, characters 15 to 28 of their ids) loses the
-- entry's orders and goes when it holds none; `#` and `#b` go down by the orders
-- and the fields dropped, and both go at zero, so an empty hash is gone. Usually
-- the field holds exactly the entry's text: one HGET, a comparison and an HDEL,
-- with no work per order. When it holds more (a second batch drew the same tag and
-- appended to it) or less (some of its orders were dropped before), its items are
-- matched order by order. A field named by an order id itself is an earlier
-- version's (one per order), counted by neither: deleted only while the hash holds
-- such fields. An order settled twice (a redelivery) is found the second time in
-- no field and counts nothing.
local key = KEYS[1]
local orders, fields = 0, 0
local stream, first_record = KEYS[2], 1
if stream then
  first_record = 3 + tonumber(ARGV[2])
end

-- The orders matched one by one: their ids, by batch tag.
local tags, asked, ids_asked = {}, {}, {}
local function ask(order)
  local tag = string.sub(order, 15, 28)
  local ids = asked[tag]
  if not ids then
    ids = {}
    asked[tag] = ids
    tags[#tags + 1] = tag
  end
  ids[order] = true
  ids_asked[#ids_asked + 1] = order
end

for i = first_record, #ARGV do
  local record = ARGV[i]
  if #record == 36 then
    ask(record)
  else
    local tag = string.sub(record, 15, 28)
    local text = redis.call('HGET', key, tag)
    if text == record then
      redis.call('HDEL', key, tag)
      fields = fields + 1
      -- Its orders: one more than its spaces (a plain find per space; gsub's
      -- pattern machinery cost as much as all the rest of the call).
      local at = 0
      repeat
        orders = orders + 1
        at = string.find(record, ' ', at + 1, true)
      until not at
    elseif text then
      for item in string.gmatch(record, '%S+') do
        ask(string.sub(item, 1, 36))
      end
    end
  end
end

for _, tag in ipairs(tags) do
  local text = redis.call('HGET', key, tag)
  if text then
    local ids, kept, dropped = asked[tag], {}, 0
    for item in string.gmatch(text, '%S+') do
      if ids[string.sub(item, 1, 36)] then
        dropped = dropped + 1
      else
        kept[#kept + 1] = item
      end
    end
    if dropped > 0 then
      orders = orders + dropped
      if #kept == 0 then
        redis.call('HDEL', key, tag)
        fields = fields + 1
      else
        redis.call('HSET', key, tag, table.concat(kept, ' '))
      end
    end
  end
end

-- (A Lua -0 would reach Redis as "-0", not an integer: only counts that moved.)
local counted = tonumber(redis.call('HGET', key, '#b') or '0')
if fields > 0 then
  counted = redis.call('HINCRBY', key, '#b', -fields)
end
if orders > 0 then
  redis.call('HINCRBY', key, '#', -orders)
end
if counted <= 0 then
  redis.call('HDEL', key, '#', '#b')
end

-- An earlier version's fields: whatever the hash holds beyond the batch fields and
-- the two counters.
local legacy = 0
local len = redis.call('HLEN', key)
if #ids_asked > 0 and len > math.max(counted, 0) + (counted > 0 and 2 or 0) then
  for from = 1, #ids_asked, 1000 do
    legacy = legacy + redis.call('HDEL', key,
      unpack(ids_asked, from, math.min(from + 999, #ids_asked)))
  end
end
if stream then
  for from = 3, first_record - 1, 1000 do
    local to = math.min(from + 999, first_record - 1)
    redis.call('XACK', stream, ARGV[1], unpack(ARGV, from, to))
    redis.call('XDEL', stream, unpack(ARGV, from, to))
  end
end
return orders + legacy
