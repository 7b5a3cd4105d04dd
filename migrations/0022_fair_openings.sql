-- Fair openings (issue 52): a proof of work before the first step into a sale or
-- poll, and a least age of the accounts that may take it. Both 0: off.
-- `proof_of_work` is the leading zero bits SHA-256(challenge ":" nonce) must have
-- (0 to 24); `min_account_age_s` how long before acting an account must exist.
ALTER TABLE sales ADD COLUMN proof_of_work SMALLINT NOT NULL DEFAULT 0
    CHECK (proof_of_work BETWEEN 0 AND 24);
ALTER TABLE sales ADD COLUMN min_account_age_s INTEGER NOT NULL DEFAULT 0
    CHECK (min_account_age_s >= 0);
ALTER TABLE polls ADD COLUMN proof_of_work SMALLINT NOT NULL DEFAULT 0
    CHECK (proof_of_work BETWEEN 0 AND 24);
ALTER TABLE polls ADD COLUMN min_account_age_s INTEGER NOT NULL DEFAULT 0
    CHECK (min_account_age_s >= 0);
