-- Admin stock changes, recorded before they reach Redis. A change moves `stock_total`
-- by the delta Redis applied, exactly once: `lua/stock_change.lua` remembers what it
-- applied under the change id, and the row turns 'applied' (adding the delta to
-- `sales.stock_total` in the same transaction) only once. A crash between the two
-- stores leaves the row 'pending', and the next actor on the sale finishes it.
CREATE TABLE stock_changes (
    id         BIGSERIAL   PRIMARY KEY,
    sale_id    BIGINT      NOT NULL REFERENCES sales (id),
    -- 'set': units left become `amount`; 'add': units left grow by `amount`.
    kind       TEXT        NOT NULL CHECK (kind IN ('set', 'add')),
    amount     BIGINT      NOT NULL CHECK (amount >= 0),
    -- 'refused': units ever offered would have passed the maximum; nothing changed.
    status     TEXT        NOT NULL DEFAULT 'pending'
                           CHECK (status IN ('pending', 'applied', 'refused')),
    delta      BIGINT,
    admin_id   BIGINT      REFERENCES users (id),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    applied_at TIMESTAMPTZ
);

CREATE INDEX stock_changes_pending_idx ON stock_changes (sale_id, id) WHERE status = 'pending';
