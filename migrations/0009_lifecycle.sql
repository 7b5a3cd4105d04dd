-- The days around a sale (issue 25): edit, hide, delete, rehearse, cancel, refund,
-- and a record of every admin change.

-- An archived sale or poll is off the public lists and the home page; its page and
-- orders stay reachable by link and in the admin. NULL: not archived.
ALTER TABLE sales
    ADD COLUMN archived_at TIMESTAMPTZ,
    -- A rehearsal (`stampede load`): fixed at creation, never on a public page or
    -- list, removed with its orders by `stampede load --cleanup`.
    ADD COLUMN rehearsal BOOLEAN NOT NULL DEFAULT FALSE;

ALTER TABLE polls
    ADD COLUMN archived_at TIMESTAMPTZ,
    ADD COLUMN updated_at TIMESTAMPTZ NOT NULL DEFAULT now();

-- The load tool's accounts, removed with the rehearsals.
ALTER TABLE users ADD COLUMN rehearsal BOOLEAN NOT NULL DEFAULT FALSE;

-- Cancelled (by an admin, or by the buyer while unpaid) and refunded (a paid order
-- an admin cancelled): like an expired order, its units go back through a
-- `stock_changes` row of kind 'return' committed with the status, applied to Redis
-- exactly once; whether its buyer may buy again is the sale's `rebuy_after_expiry`.
ALTER TABLE orders DROP CONSTRAINT orders_status_check;
ALTER TABLE orders
    ADD CONSTRAINT orders_status_check
        CHECK (status IN ('accepted', 'awaiting_payment', 'paid', 'expired', 'cancelled', 'refunded')),
    ADD COLUMN cancelled_at TIMESTAMPTZ,
    -- Who cancelled: the buyer or an admin.
    ADD COLUMN cancelled_by BIGINT REFERENCES users (id);

DROP INDEX orders_one_live_per_buyer;
CREATE UNIQUE INDEX orders_one_live_per_buyer ON orders (sale_id, user_id)
    WHERE status NOT IN ('expired', 'cancelled', 'refunded') AND NOT multi_unit;

-- A paid order cancelled by an admin: the payment is refunded (simulated provider).
ALTER TABLE payments ADD COLUMN refunded_at TIMESTAMPTZ;

-- Who changed what: one row per admin change, written in the change's own
-- transaction. No foreign key to the sale or poll: the record outlives a delete.
CREATE TABLE admin_changes (
    id         BIGSERIAL   PRIMARY KEY,
    admin_id   BIGINT      REFERENCES users (id) ON DELETE SET NULL,
    at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- create, edit, stock, open, close, archive, unarchive, delete, cancel, refund
    action     TEXT        NOT NULL,
    sale_id    BIGINT,
    poll_id    BIGINT,
    order_id   UUID,
    before     JSONB,
    after      JSONB,
    CHECK ((sale_id IS NULL) <> (poll_id IS NULL))
);

CREATE INDEX admin_changes_sale_idx ON admin_changes (sale_id, id) WHERE sale_id IS NOT NULL;
CREATE INDEX admin_changes_poll_idx ON admin_changes (poll_id, id) WHERE poll_id IS NOT NULL;
