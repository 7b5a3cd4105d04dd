-- Accounts removed while a token of theirs may still be valid: the rehearsal
-- cleanup's admins (a `stampede load` run signs its admin a token of its own, and
-- the cleanup removes the account). A token carries the admin flag it was signed
-- with, so without this it kept working on the admin API until it expired. Every
-- process treats every session of these accounts as ended (src/auth/session)
-- until `until`, the last moment a token issued before the removal can live;
-- the cleanup removes the rows past it.
CREATE TABLE ended_accounts (
    user_id BIGINT PRIMARY KEY,
    until   TIMESTAMPTZ NOT NULL
);
