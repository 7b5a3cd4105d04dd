-- Ballot kinds (issue 51): what a voter sends and how it counts.
--   single  one option (every poll made before this column)
--   multi   1 to max_choices distinct options, each counted once
--   budget  votes_per_user votes to spend over as many requests as the voter likes,
--           at most max_per_option on one option
--   ranked  1 to max_choices distinct options, most preferred first; tallies count
--           first preferences, the result after the close is an instant runoff
-- allow_change (single, multi, ranked): a later ballot replaces the voter's earlier
-- one until the close. Every setting is editable until the opening, like the rest.
ALTER TABLE polls
    ADD COLUMN ballot TEXT NOT NULL DEFAULT 'single'
        CHECK (ballot IN ('single', 'multi', 'budget', 'ranked')),
    ADD COLUMN max_choices INTEGER CHECK (max_choices >= 1),
    ADD COLUMN votes_per_user INTEGER CHECK (votes_per_user BETWEEN 1 AND 1000),
    ADD COLUMN max_per_option INTEGER CHECK (max_per_option >= 1),
    ADD COLUMN allow_change BOOLEAN NOT NULL DEFAULT FALSE,
    ADD CHECK ((max_choices IS NULL) OR ballot IN ('multi', 'ranked')),
    ADD CHECK ((votes_per_user IS NOT NULL) = (ballot = 'budget')),
    ADD CHECK ((max_per_option IS NULL) OR (ballot = 'budget' AND max_per_option <= votes_per_user)),
    ADD CHECK (NOT allow_change OR ballot <> 'budget');

-- One row per accepted vote request: a voter's `seq`-th ballot of the poll (1, 2, ...
-- in the order Redis accepted them). In a single, multi or ranked poll the row with
-- the highest seq is the voter's ballot that counts (a lower one was replaced); in a
-- budget poll every row counts, `count` votes each. `option_id` is the first choice
-- (the budget vote's option); `choices` every option of a multi or ranked ballot,
-- in the order sent (NULL for single and budget). The receipt of a row is derived
-- from (poll_id, user_id, seq): see src/vote/receipt.rs.
ALTER TABLE votes
    ADD COLUMN seq INTEGER NOT NULL DEFAULT 1 CHECK (seq >= 1),
    ADD COLUMN choices BIGINT[],
    ADD COLUMN count INTEGER NOT NULL DEFAULT 1 CHECK (count >= 1);
ALTER TABLE votes DROP CONSTRAINT votes_pkey;
ALTER TABLE votes ADD PRIMARY KEY (poll_id, user_id, seq);
