-- The draw's recipe. Recipe 1 keyed each entry with the seed alone: whoever read
-- the seed before the draw (an operator, a backup) could compute the key of the
-- entry ids to come (they are sequential) and time an entry to win. Recipe 2
-- keys the entries with HMAC-SHA-256(seed, the entries digest), where the digest
-- is the SHA-256 of every entry id in the draw, so no entry's key is known before
-- the entries close (see src/sale/draw/order.rs, docs/api.md "Draw sales").
-- Draws that exist keep recipe 1 (their commitment and any place already shown
-- follow it); every draw made from now on is recipe 2. `entries_digest` is set by
-- a recipe-2 draw and published with it.
ALTER TABLE sale_draws ADD COLUMN recipe smallint NOT NULL DEFAULT 1 CHECK (recipe IN (1, 2));
ALTER TABLE sale_draws ALTER COLUMN recipe SET DEFAULT 2;
ALTER TABLE sale_draws ADD COLUMN entries_digest bytea CHECK (length(entries_digest) = 32);
