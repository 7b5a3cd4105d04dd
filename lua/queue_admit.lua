-- One step of a sale's waiting room (see src/sale/queue/), run by every server
-- a few times a second; atomic and paced by the Redis clock, so any number of
-- servers admit at the sale's rate together.
-- KEYS[1] meta hash   KEYS[2] stock counter   KEYS[3] line (user -> place)
-- KEYS[4] queue state hash: head (the place of the last one admitted), served
-- (places at or before head), credit and last_ms (the pace), admitted, passed;
-- ended (admissions seen ended: bought or passed), pshare and pweight (the share of
-- passes among about the last 50 ended, and how many it is over: the estimate's)
-- KEYS[5] admissions open (sorted set user -> expiry ms: admitted, not yet bought,
-- not expired)   KEYS[6] admissions ever (hash user -> expiry ms)
-- KEYS[7] admissions not yet written to Postgres (stream: one entry per admission,
-- `u` user, `e` expiry ms; the admitter copies and deletes them, so an admission
-- reaches Postgres even when the write right after this step fails or its server
-- dies first)
-- ARGV[1] now in ms ('' = the Redis clock)   ARGV[2] an admission's life in ms
-- ARGV[3] most admitted by this call
-- First, admissions past their life leave the open set: they passed, and the
-- recent share of passes takes in what ended since the last step. Then, once the
-- sale is open and the line not paused (meta `q_paused`, an admin's), up to min(credit, units left - admissions open) shoppers from the
-- head of the line are admitted: never more shoppers admitted and unexpired than
-- units left. Credit grows at `wr` a second from the opening, at most one second's.
-- Returns {code, passed now, user, expiry ms, user, expiry ms, ...} (the admitted):
--   0 done   2 not open yet   3 ended or closed   4 not loaded   6 recovering
--   13 no waiting room   14 paused
local meta = redis.call('HMGET', KEYS[1], 'starts_ms', 'ends_ms', 'closed', 'run', 'wr', 'q_paused')
if not meta[1] then
  return {4, 0}
end
if not same_run(meta[4]) or redis.call('EXISTS', KEYS[2]) == 0 then
  return {6, 0}
end
local rate = tonumber(meta[5]) or 0
if rate <= 0 then
  return {13, 0}
end
local now = clock_ms(ARGV[1])
local gone = redis.call('ZRANGEBYSCORE', KEYS[5], '-inf', now, 'LIMIT', 0, 1000)
if #gone > 0 then
  redis.call('ZREM', KEYS[5], unpack(gone))
  redis.call('HINCRBY', KEYS[4], 'passed', #gone)
end
-- The share of passes over about the last SHARE_OVER ended admissions: those that
-- ended since the last step (admitted before it, no longer open), #gone of them
-- passed (the rest bought), folded into the running share.
local SHARE_OVER = 50
local seen = redis.call('HMGET', KEYS[4], 'admitted', 'ended', 'pshare', 'pweight')
local ended = (tonumber(seen[1]) or 0) - redis.call('ZCARD', KEYS[5])
local fresh = ended - (tonumber(seen[2]) or 0)
if fresh > 0 then
  local weight = math.min(tonumber(seen[4]) or 0, SHARE_OVER)
  local share = ((tonumber(seen[3]) or 0) * weight + math.min(#gone, fresh)) / (weight + fresh)
  redis.call('HSET', KEYS[4], 'ended', ended, 'pshare', share,
    'pweight', math.min(weight + fresh, SHARE_OVER))
elseif fresh < 0 then
  redis.call('HSET', KEYS[4], 'ended', ended)
end
if meta[3] == '1' or now >= tonumber(meta[2]) then
  return {3, #gone}
end
local starts = tonumber(meta[1])
if now < starts then
  return {2, #gone}
end
if meta[6] == '1' then
  -- Paused: nobody admitted, and no credit saved up for the resumption.
  redis.call('HSET', KEYS[4], 'credit', 0, 'last_ms', now)
  return {14, #gone}
end
local st = redis.call('HMGET', KEYS[4], 'head', 'credit', 'last_ms')
local last = tonumber(st[3]) or starts
local credit = math.min(rate, (tonumber(st[2]) or 0) + math.max(0, now - last) * rate / 1000)
local room = tonumber(redis.call('GET', KEYS[2])) - redis.call('ZCARD', KEYS[5])
local k = math.min(math.floor(credit), room, tonumber(ARGV[3]))
local out = {0, #gone}
if k > 0 then
  local from = st[1] and ('(' .. st[1]) or '-inf'
  local next = redis.call('ZRANGEBYSCORE', KEYS[3], from, '+inf', 'WITHSCORES', 'LIMIT', 0, k)
  local expires = now + tonumber(ARGV[2])
  local admitted = 0
  for j = 1, #next, 2 do
    local user = next[j]
    -- Never twice: a place restored after a wipe may belong to someone admitted.
    if redis.call('HSETNX', KEYS[6], user, expires) == 1 then
      redis.call('ZADD', KEYS[5], expires, user)
      redis.call('XADD', KEYS[7], '*', 'u', user, 'e', expires)
      out[#out + 1] = user
      out[#out + 1] = expires
      admitted = admitted + 1
    end
  end
  if #next > 0 then
    redis.call('HSET', KEYS[4], 'head', next[#next])
    redis.call('HINCRBY', KEYS[4], 'served', #next / 2)
  end
  if admitted > 0 then
    redis.call('HINCRBY', KEYS[4], 'admitted', admitted)
  end
  credit = credit - admitted
end
redis.call('HSET', KEYS[4], 'credit', credit, 'last_ms', now)
return out
