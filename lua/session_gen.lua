-- An account's session state: raise its generation to at least ARGV[1] (never
-- lower it: Postgres raised it first, and a late writer must not undo a newer
-- "end all sessions"), optionally mark session ARGV[3] signed out, and keep the
-- hash at least ARGV[2] seconds (the longest any token issued so far can live).
-- KEYS[1]: `{user:<id>}:session` hash (`gen`, `out:<session id>`).
local key = KEYS[1]
local gen = tonumber(ARGV[1])
local ttl = tonumber(ARGV[2])
local current = tonumber(redis.call('HGET', key, 'gen') or '-1')
if gen > current then
  redis.call('HSET', key, 'gen', gen)
  current = gen
end
if ARGV[3] and ARGV[3] ~= '' then
  redis.call('HSET', key, 'out:' .. ARGV[3], 1)
end
if redis.call('TTL', key) < ttl then
  redis.call('EXPIRE', key, ttl)
end
return current
