-- Release a lock, but only for its owner: delete the key if it still holds our token.
-- A holder whose lease expired (and was taken by someone else) deletes nothing.
-- KEYS[1] lock key   ARGV[1] owner token
-- Returns:
--   1 released   0 not held (the key is gone or belongs to another holder)
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
