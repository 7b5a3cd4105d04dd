-- A vote's Idempotency-Key (issue 51), kept with the vote as an order keeps its
-- own: the rebuild after a Redis wipe or restart restores the keys of votes
-- accepted within `purchase_key_ttl_secs`, so a retry whose 202 Redis forgot gets
-- that 202 again and a budget is never spent twice. NULL: sent without a key.
ALTER TABLE votes ADD COLUMN idempotency_key TEXT;
