-- Payment, and units that come back.
--
-- A sale with a payment window (seconds, fixed at creation; 0 = no payment step)
-- makes each settled order `awaiting_payment` until `POST /api/orders/{id}/pay`
-- turns it `paid`. An order not paid by `pay_by` turns `expired`, and in the same
-- transaction a `stock_changes` row of kind 'return' records that its unit goes
-- back; `lua/stock_change.lua` applies it to Redis exactly once, as it does an
-- admin's change. Whether the expired buyer may buy again is the sale's
-- `rebuy_after_expiry`, fixed at creation:
--   false: the buyer stays in the buyers set and the unit is offered again:
--          `stock_total` (units ever offered) grows by one;
--   true:  the buyer leaves the buyers set and the unit is back in the stock;
--          `stock_total` does not move.
-- Either way `stock_total = units left + buyers` holds in both stores.
ALTER TABLE sales
    ADD COLUMN payment_window_s INTEGER NOT NULL DEFAULT 0
        CHECK (payment_window_s >= 0 AND payment_window_s <= 86400),
    ADD COLUMN rebuy_after_expiry BOOLEAN NOT NULL DEFAULT FALSE;

-- 'accepted': a sale with no payment step (as before payments existed).
ALTER TABLE orders
    ADD COLUMN status TEXT NOT NULL DEFAULT 'accepted'
        CHECK (status IN ('accepted', 'awaiting_payment', 'paid', 'expired')),
    ADD COLUMN pay_by TIMESTAMPTZ,
    ADD COLUMN paid_at TIMESTAMPTZ,
    ADD COLUMN expired_at TIMESTAMPTZ,
    ADD CHECK ((status = 'awaiting_payment') <= (pay_by IS NOT NULL));

-- One live order per buyer and sale; an expired order no longer counts (its buyer
-- may buy again when the sale allows it).
ALTER TABLE orders DROP CONSTRAINT orders_sale_id_user_id_key;
CREATE UNIQUE INDEX orders_one_live_per_buyer ON orders (sale_id, user_id)
    WHERE status <> 'expired';
CREATE INDEX orders_due_idx ON orders (pay_by) WHERE status = 'awaiting_payment';

ALTER TABLE stock_changes DROP CONSTRAINT stock_changes_kind_check;
ALTER TABLE stock_changes
    ADD CONSTRAINT stock_changes_kind_check CHECK (kind IN ('set', 'add', 'return')),
    -- The expired order whose unit a 'return' gives back: one return per order.
    ADD COLUMN order_id UUID UNIQUE REFERENCES orders (id),
    ADD CHECK ((kind = 'return') = (order_id IS NOT NULL));

-- The simulated payment provider's record, one row per idempotency key: a retry
-- with the same key gets the stored answer back and never pays twice.
CREATE TABLE payments (
    user_id         BIGINT      NOT NULL REFERENCES users (id),
    idempotency_key TEXT        NOT NULL,
    order_id        UUID        NOT NULL REFERENCES orders (id),
    amount_cents    BIGINT      NOT NULL,
    -- The answer given, replayed to a retry.
    http_status     SMALLINT    NOT NULL,
    answer          JSONB       NOT NULL,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    PRIMARY KEY (user_id, idempotency_key)
);
