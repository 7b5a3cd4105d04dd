-- Idempotency keys in a batch script (lua/purchase_batch.lua, lua/vote_batch.lua):
-- `idem[i]` is item i's field `<user>:<key>` in the script's keys hash (nil without
-- a key). A key whose answer the hash remembers gets it again (the script's
-- `replay`), counted by no limit and touching nothing; a key twice in one batch:
-- the second gets the first's answer.

-- The answers the keys hash `hash` remembers for the batch's keys (one HMGET):
-- returns `skip` (items not to decide: a remembered key, or a key's repeat within
-- the batch), `first_of` (field -> the first item with it) and `stored` (field ->
-- the remembered answer).
local function keys_load(n, idem, hash)
  local skip, first_of, stored = {}, {}, {}
  -- (Grown by a count: `#t` is a search in Lua 5.1.)
  local fields, asked, m = {}, {}, 0
  for i = 1, n do
    local f = idem[i]
    if f then
      if first_of[f] then
        skip[i] = true
      else
        first_of[f] = i
        m = m + 1
        fields[m], asked[m] = f, i
      end
    end
  end
  local known = batch_variadic('HMGET', hash, fields)
  for j = 1, m do
    local s = known[j]
    if s then
      stored[fields[j]] = s
      skip[asked[j]] = true
    end
  end
  return skip, first_of, stored
end

-- After the decision: remembers the answers of the keys first seen in this batch
-- (`text_of(i)`: the text to remember for item i, nil for an answer that is not
-- remembered), answers each key's repeats (`replay(i, text)` for a remembered one;
-- else `reused(i, first)` answers a repeat whose body is not its first's, "key
-- used with another body", and returns true; else the first's answer as it is),
-- and writes the hash once (one HSET), its expiry (`ttl_ms`) refreshed when it
-- remembered something or `replayed()`.
local function keys_remember(n, idem, first_of, stored, hash, ttl_ms, d, text_of, replay,
    reused, replayed)
  local remembered, r = {}, 0
  for i = 1, n do
    local f = idem[i]
    if f and first_of[f] == i and not stored[f] then
      local s = text_of(i)
      if s then
        stored[f] = s
        remembered[r + 1], remembered[r + 2] = f, s
        r = r + 2
      end
    end
  end
  for i = 1, n do
    local f = idem[i]
    if f and first_of[f] ~= i then
      local first = first_of[f]
      if stored[f] then
        replay(i, stored[f])
      elseif not reused(i, first) then
        -- The first was not decided (window, limits, an answer not remembered):
        -- the same answer to the same body.
        d.code[i], d.value[i], d.texts[i], d.answers[i] = d.code[first], d.value[first],
          d.texts[first], d.answers[first]
      end
    end
  end
  if r > 0 then
    batch_variadic('HSET', hash, remembered)
  end
  if r > 0 or replayed() then
    redis.call('PEXPIRE', hash, ttl_ms)
  end
end
