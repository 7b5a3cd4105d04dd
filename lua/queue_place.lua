-- Shoppers' places in a sale's waiting room (see src/sale/queue/), a batch of
-- them in one call: joining (one place per account, the same answer however often
-- it joins) or only reading, and where each stands.
-- KEYS[1] meta hash (starts_ms, ends_ms, closed, run, wr = admissions a second,
-- q_opens_ms)   KEYS[2] stock counter   KEYS[3] line (sorted set user -> place)
-- KEYS[4] queue state hash (head, seq, joins, ...)   KEYS[5] joins stream (copied
-- to Postgres by the admitter)   KEYS[6] admissions open (user -> expiry ms)
-- KEYS[7] admissions ever (user -> expiry ms)   KEYS[8] buyers hash
-- ARGV[1] now in ms ('' = the Redis clock), then per shopper: user id, the place
-- it takes if it joins before the opening (a random integer in [1, 2^52) drawn by
-- the server), '1' to join or '0' only to read
-- A place is a score: everyone who joins before the opening holds a random one
-- below 2^52 (so the line's early part is in random order, whenever they came);
-- a later joiner holds 2^52 + n, n counting the late joins (arrival order).
-- Returns {now ms, starts_ms, admissions a second, waiting, units left, admissions
-- open, paused, joins closed, pass share (parts per million; -1: none ended yet),
-- how many ended admissions that share is over, soonest and latest end of an open
-- admission (ms; 0: none open), units one shopper may buy (per_user; 1 when
-- absent)}, then per shopper {code, value, state, position,
-- ahead, expiry ms}; code:
--   0 done (value 1: this call took a new place, else 0; then the standing)
--   2 the line does not open yet (value = ms until it does)   3 ended or closed
--   4 not loaded   5 sold out   6 recovering   13 the sale has no waiting room
--   14 the line is closed to new joins (an admin's `q_closed`)
-- The standing, with code 0: position, the 1-based place (0: none); ahead, people
-- still waiting before this one (-1 before the opening: the early order is drawn
-- then); expiry, an admission's end, or for a shopper waiting whose turn needs
-- passes (more ahead than units left not held by an open admission), the end of
-- the open admission whose pass would be the one that lets this shopper in if
-- every admission before it passed (0: none); state:
--   0 not in line   1 waiting   2 admitted (until expiry)   3 passed (admitted,
--   never bought, expired)   4 bought   5 sold out (waiting, no unit left)
-- waiting: people not yet reached by admission, after this batch's joins.
local n = (#ARGV - 1) / 3
local meta = redis.call('HMGET', KEYS[1], 'starts_ms', 'ends_ms', 'closed', 'run', 'wr', 'q_opens_ms',
  'q_paused', 'q_closed', 'per_user')
local now = clock_ms(ARGV[1])
local out = {now, 0, 0, 0, 0, 0, 0, 0, -1, 0, 0, 0, tonumber(meta[9]) or 1}
local function all(code)
  for _ = 1, n do
    out[#out + 1] = code
    for _ = 1, 5 do
      out[#out + 1] = 0
    end
  end
  return out
end
if not meta[1] then
  return all(4)
end
if not same_run(meta[4]) or redis.call('EXISTS', KEYS[2]) == 0 then
  return all(6)
end
local rate = tonumber(meta[5]) or 0
if rate <= 0 then
  return all(13)
end
local starts = tonumber(meta[1])
out[2], out[3] = starts, rate
local ended = meta[3] == '1' or now >= tonumber(meta[2])
local opens = math.min(tonumber(meta[6]) or starts, starts)
local stock = tonumber(redis.call('GET', KEYS[2]))
local head = redis.call('HGET', KEYS[4], 'head')
local after_head = head and ('(' .. head) or '-inf'

-- The batch's shoppers, and the places they hold before it (one ZMSCORE).
local users = {}
for i = 1, n do
  users[i] = ARGV[2 + (i - 1) * 3]
end
local held = batch_variadic('ZMSCORE', KEYS[3], users)

-- Joins first, in order (a user twice in the batch holds one place: the place the
-- first took is `placed` for the second).
local places, new, placed = {}, {}, {}
local refusal = {}
-- (`added`: score and member of each new place, for the ZADD after the loop.)
local added, joined = {}, 0
for i = 1, n do
  local user = users[i]
  local place = placed[user] or held[i] or nil
  if not place and ARGV[4 + (i - 1) * 3] == '1' then
    if ended then
      refusal[i] = {3, 0}
    elseif meta[8] == '1' then
      refusal[i] = {14, 0}
    elseif now < opens then
      refusal[i] = {2, opens - now}
    elseif stock <= 0 then
      refusal[i] = {5, 0}
    else
      if now < starts then
        place = ARGV[3 + (i - 1) * 3]
      else
        place = string.format('%.0f', 4503599627370496 + redis.call('HINCRBY', KEYS[4], 'seq', 1))
      end
      redis.call('XADD', KEYS[5], '*', 'u', user, 'p', place, 't', now)
      new[i] = 1
      placed[user] = place
      joined = joined + 1
      added[2 * joined - 1], added[2 * joined] = place, user
    end
  end
  places[i] = place
end
-- The batch's new places, in one ZADD, and their count (before anyone's standing).
if joined > 0 then
  batch_variadic('ZADD', KEYS[3], added)
  redis.call('HINCRBY', KEYS[4], 'joins', joined)
end

-- Then where each stands, and what moves the line (the estimate's inputs).
out[4] = redis.call('ZCOUNT', KEYS[3], after_head, '+inf')
local open = redis.call('ZCARD', KEYS[6])
local share = redis.call('HMGET', KEYS[4], 'pshare', 'pweight')
out[5], out[6] = stock, open
out[7], out[8] = meta[7] == '1' and 1 or 0, meta[8] == '1' and 1 or 0
if tonumber(share[2] or 0) > 0 then
  out[9], out[10] = math.floor(tonumber(share[1]) * 1000000 + 0.5), tonumber(share[2])
end
local function open_end(index)
  local e = redis.call('ZRANGE', KEYS[6], index, index, 'WITHSCORES')
  return tonumber(e[2]) or 0
end
if open > 0 then
  out[11], out[12] = open_end(0), open_end(-1)
end
-- With `ahead` before a shopper and `room` units not held by an open admission, the
-- turn needs ahead + 1 - room passes; the soonest is the end of that open admission.
local room = math.max(0, stock - open)
local function needed_end(ahead)
  local passes = ahead + 1 - room
  if passes < 1 or passes > open then
    return 0
  end
  return open_end(passes - 1)
end
local function standing(i, state, position, ahead, expiry)
  local o = #out
  out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] =
    0, new[i] or 0, state, position, ahead, expiry
end
-- Who bought, and who was ever admitted, for every shopper at once (one HMGET
-- each; a shopper in neither reads false).
local bought = batch_variadic('HMGET', KEYS[8], users)
local ever = batch_variadic('HMGET', KEYS[7], users)
for i = 1, n do
  local user = users[i]
  local place = places[i]
  if refusal[i] then
    local o = #out
    out[o + 1], out[o + 2], out[o + 3], out[o + 4], out[o + 5], out[o + 6] =
      refusal[i][1], refusal[i][2], 0, 0, 0, 0
  else
    local position = place and redis.call('ZCOUNT', KEYS[3], '-inf', place) or 0
    if bought[i] then
      standing(i, 4, position, 0, 0)
    elseif ever[i] then
      local expiry = tonumber(redis.call('ZSCORE', KEYS[6], user))
      if expiry and expiry > now then
        standing(i, 2, position, 0, expiry)
      else
        standing(i, 3, position, 0, 0)
      end
    elseif not place then
      standing(i, 0, 0, 0, 0)
    elseif stock <= 0 then
      standing(i, 5, position, 0, 0)
    elseif now < starts then
      standing(i, 1, position, -1, 0)
    else
      local ahead = redis.call('ZCOUNT', KEYS[3], after_head, '(' .. place)
      standing(i, 1, position, ahead, needed_end(ahead))
    end
  end
end
return out
