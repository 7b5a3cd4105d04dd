-- Draw sales (issue 52, src/sale/draw/): shoppers enter from `entries_open_at`
-- until the draw (`starts_at`), the entries are ordered by HMAC-SHA-256 under a
-- seed drawn at creation, and the first of them may buy, each for a claim window.
-- `draw_commitment` (hex SHA-256 of the seed) is public from creation; the seed
-- itself stays in `sale_draws` until the draw.
ALTER TABLE sales
    ADD COLUMN mode text NOT NULL DEFAULT 'first_come',
    ADD COLUMN entries_open_at timestamptz,
    ADD COLUMN claim_window_s integer,
    ADD COLUMN draw_commitment text,
    ADD CONSTRAINT sales_mode CHECK (mode IN ('first_come', 'draw')),
    ADD CONSTRAINT sales_draw_settings CHECK (
        mode <> 'draw'
        OR (entries_open_at IS NOT NULL AND entries_open_at < starts_at
            AND claim_window_s BETWEEN 60 AND 86400
            AND draw_commitment IS NOT NULL AND NOT waiting_room)
    );

-- One row per draw sale: the secret seed (published once drawn), when it was
-- drawn, how many entries it ordered, how many of them have been offered a win
-- so far (in seeded order), and when nothing more can pass on (stock sold or
-- entries run out).
CREATE TABLE sale_draws (
    sale_id     bigint PRIMARY KEY,
    seed        bytea NOT NULL CHECK (length(seed) = 32),
    drawn_at    timestamptz,
    entries     integer,
    offered     integer NOT NULL DEFAULT 0,
    finished_at timestamptz
);
-- Every server lists the draws due or still passing on every second: only those.
CREATE INDEX sale_draws_active ON sale_draws (sale_id) WHERE finished_at IS NULL;

-- The entries: one per account. `rank` is the place in the seeded order (1 first),
-- set by the draw; `won_at` and `claim_until` once the entry is offered a win;
-- `outcome` once that win is settled: `bought` or `passed`.
CREATE TABLE draw_entries (
    id          bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    sale_id     bigint NOT NULL,
    user_id     bigint NOT NULL,
    entered_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    rank        integer,
    won_at      timestamptz,
    claim_until timestamptz,
    outcome     text CHECK (outcome IN ('bought', 'passed')),
    PRIMARY KEY (sale_id, user_id)
);
CREATE INDEX draw_entries_rank ON draw_entries (sale_id, rank) WHERE rank IS NOT NULL;
CREATE INDEX draw_entries_open_wins ON draw_entries (sale_id)
    WHERE won_at IS NOT NULL AND outcome IS NULL;
