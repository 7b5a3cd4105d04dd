-- A settled vote's row checked three foreign keys, and each check is an index
-- look-up and a lock of the row it names: together about as much Postgres work as
-- the row itself (scripts/bench-vote-rows, docs/testing.md). Two of them guard
-- nothing the application does not: a vote names a poll and an option that Redis
-- accepted it for (only a loaded poll's options), and a poll or its options are
-- deleted only while the poll has no vote, settled or accepted and not yet settled
-- (src/vote/lifecycle.rs, under the poll's row lock; options change only before the
-- opening). They go, with the option index that only their deletes used. The key
-- to `users` stays: a rehearsal's cleanup removes users, and settlement relies on
-- it (migrations/0015_user_removals.sql).
ALTER TABLE votes
    DROP CONSTRAINT IF EXISTS votes_poll_id_fkey,
    DROP CONSTRAINT IF EXISTS votes_option_id_fkey;
DROP INDEX IF EXISTS votes_option_idx;
