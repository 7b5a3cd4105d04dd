-- A sale may have a waiting room (issue 29, src/sale/queue.rs): a line that opens at
-- `queue_opens_at`, from which shoppers are admitted at `admit_per_second` once the
-- sale opens. Redis holds the line; Postgres keeps what a wipe must not lose.
ALTER TABLE sales
    ADD COLUMN waiting_room boolean NOT NULL DEFAULT false,
    ADD COLUMN queue_opens_at timestamptz,
    ADD COLUMN admit_per_second integer,
    ADD CONSTRAINT sales_waiting_room_settings CHECK (
        NOT waiting_room
        OR (queue_opens_at IS NOT NULL AND admit_per_second BETWEEN 1 AND 100000)
    );
-- Every server lists the waiting rooms that need admitting every 2 s: an index of
-- only those, so a catalog of many sales pays nothing for it.
CREATE INDEX sales_waiting_rooms ON sales (ends_at) WHERE waiting_room;

-- Places in a line, copied from Redis by the admitter (a few hundred ms behind):
-- after a Redis wipe the line is rebuilt from them.
CREATE TABLE queue_places (
    sale_id   bigint NOT NULL,
    user_id   bigint NOT NULL,
    -- The place: a random integer below 2^52 for an early joiner, 2^52 + n after.
    place     double precision NOT NULL,
    joined_at timestamptz NOT NULL,
    PRIMARY KEY (sale_id, user_id)
);

-- Every admission given: after a wipe nobody is admitted a second time, and an
-- admission still running is given back to its holder.
CREATE TABLE queue_admissions (
    sale_id     bigint NOT NULL,
    user_id     bigint NOT NULL,
    expires_at  timestamptz NOT NULL,
    admitted_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (sale_id, user_id)
);
