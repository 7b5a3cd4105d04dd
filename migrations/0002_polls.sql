-- Polls, their options and the settled votes. One vote per user per poll.

CREATE TABLE polls (
    id         BIGSERIAL PRIMARY KEY,
    question   TEXT        NOT NULL,
    opens_at   TIMESTAMPTZ NOT NULL,
    closes_at  TIMESTAMPTZ NOT NULL,
    closed     BOOLEAN     NOT NULL DEFAULT FALSE,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (closes_at > opens_at)
);

CREATE TABLE poll_options (
    id       BIGSERIAL PRIMARY KEY,
    poll_id  BIGINT  NOT NULL REFERENCES polls (id),
    label    TEXT    NOT NULL,
    position INTEGER NOT NULL,
    UNIQUE (poll_id, position)
);

-- Written by the settlement worker; the primary key makes every write idempotent.
CREATE TABLE votes (
    poll_id   BIGINT      NOT NULL REFERENCES polls (id),
    user_id   BIGINT      NOT NULL REFERENCES users (id),
    option_id BIGINT      NOT NULL REFERENCES poll_options (id),
    voted_at  TIMESTAMPTZ NOT NULL,
    settled_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (poll_id, user_id)
);

CREATE INDEX votes_option_idx ON votes (option_id);
