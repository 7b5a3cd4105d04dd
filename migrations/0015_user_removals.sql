-- Settlement's insert joined every order with its user, the guard against an order
-- of a user that is gone (in place of the foreign key 0012 dropped): about 0.7 us
-- of Postgres per settled order (docs/capacity.md). Users are removed only by the
-- rehearsal cleanup (src/sale/rehearsal.rs), and an order of a removed user can
-- reach settlement only for a while after it: one its buyer's token (issued before
-- the removal, living `token_ttl`) was accepted with, or one accepted before the
-- removal and not yet settled. The cleanup records each removal here, open
-- `until` the last such order can have come; settlement looks an order's user up
-- only while a removal is open (src/sale/settlement.rs).
CREATE TABLE user_removals (
    removed_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    until TIMESTAMPTZ NOT NULL,
    -- How many users the cleanup removed.
    users BIGINT NOT NULL
);
