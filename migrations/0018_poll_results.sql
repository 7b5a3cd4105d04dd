-- Who sees a poll's tallies (issue 51, results visibility): `live` (everyone, at
-- once: the behaviour before this column), `after_vote` (a voter once their ballot
-- is in), `after_close`, or `on_reveal` (after an admin's reveal, which needs the
-- poll closed). Editable until the opening, like the poll's other settings.
ALTER TABLE polls
    ADD COLUMN results TEXT NOT NULL DEFAULT 'live'
        CHECK (results IN ('live', 'after_vote', 'after_close', 'on_reveal')),
    -- When an admin revealed an `on_reveal` poll's results; NULL: not revealed.
    ADD COLUMN revealed_at TIMESTAMPTZ,
    ADD CHECK (revealed_at IS NULL OR results = 'on_reveal');
