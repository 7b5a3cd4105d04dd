-- Sessions that end (issue 13). A token carries its account's session generation
-- and a random session id. Ending every session of an account (or changing its
-- password) raises `session_gen`; signing out records the one session. Redis holds
-- both for the hot path (`{user:<id>}:session`); these are the record it is rebuilt
-- from when Redis lost them (see src/auth/session.rs).
ALTER TABLE users ADD COLUMN session_gen BIGINT NOT NULL DEFAULT 0;

CREATE TABLE signed_out_sessions (
    user_id    BIGINT      NOT NULL REFERENCES users (id) ON DELETE CASCADE,
    -- The token's session id, 16 hex digits.
    session    TEXT        NOT NULL,
    -- When the token would have expired: after that the row is useless.
    expires_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (user_id, session)
);
