-- A settled vote's row checked its foreign key to `users`: an index look-up and a
-- lock of the user's row (which writes the row), about 5 us of Postgres a row
-- (scripts/bench-vote-rows: user_fk against no_fk), half of what a vote's row cost.
-- Orders dropped theirs in 0012 and guard with `user_removals` (0015): users are
-- removed only by the rehearsal cleanup, which removes no user with a vote and
-- records each removal; settlement looks a vote's user up only while a removal is
-- open, so the vote of a user removed meanwhile is not written (src/vote/settlement.rs).
ALTER TABLE votes DROP CONSTRAINT IF EXISTS votes_user_id_fkey;
