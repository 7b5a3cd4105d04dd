-- Extend a lock's lease, but only for its owner. PEXPIRE never creates a key, and the
-- token check means a holder whose lease expired cannot revive it over a new holder.
-- KEYS[1] lock key   ARGV[1] owner token   ARGV[2] new lease in milliseconds
-- Returns:
--   1 extended   0 not held (the key is gone or belongs to another holder)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
