-- Start a rebuild of a sale or poll: decisions stop (they answer "recovering") until
-- the matching restore script runs with the same token. If Redis loses the token
-- meanwhile (wiped again, restarted), the restore refuses and the rebuild starts over.
-- KEYS[1] meta hash   KEYS[2] rebuild token key
-- ARGV[1] token   ARGV[2] token ttl ms
redis.call('SET', KEYS[2], ARGV[1], 'PX', ARGV[2])
if redis.call('EXISTS', KEYS[1]) == 1 then
  redis.call('HSET', KEYS[1], 'run', 'fenced')
end
return 1
