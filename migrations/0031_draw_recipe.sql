-- The draw's recipe. Recipe 1 keyed each entry with the seed alone: whoever read
-- the seed before the draw (an operator, a backup) could compute the key of the
-- entry ids to come (they are sequential) and time an entry to win. Recipe 2
-- keys the entries with HMAC-SHA-256(seed, the entries digest), where the digest
-- is the SHA-256 of every entry id in the draw, so no entry's key is known before
-- the entries close (see src/sale/draw/order.rs, docs/api.md "Draw sales").
-- The draw writes the recipe it followed, with the digest: a draw made before
-- this (or, during a rolling upgrade, by a server of the version before) keeps
-- the default, 1, which is how it was made; every draw this version makes is 2,
-- whenever its sale was created.
ALTER TABLE sale_draws ADD COLUMN recipe smallint NOT NULL DEFAULT 1 CHECK (recipe IN (1, 2));
ALTER TABLE sale_draws ADD COLUMN entries_digest bytea CHECK (length(entries_digest) = 32);
