-- Store a rebuilt cached view, but only while the rebuild lock is still ours. An admin
-- change deletes the view and its lock together, so a rebuild that read Postgres before
-- the change finds its token gone and cannot write the stale view back.
-- KEYS[1] cached view   KEYS[2] its rebuild lock (same hash tag)
-- ARGV[1] value   ARGV[2] time to live in milliseconds   ARGV[3] lock token
-- Returns:
--   1 stored   0 the lock was lost (nothing written)
if redis.call('GET', KEYS[2]) == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
return 0
