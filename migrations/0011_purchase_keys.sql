-- A purchase's Idempotency-Key (issue 26): the key the buyer sent with the purchase
-- that created this order, or NULL. Redis remembers keys for the decisions it makes
-- (`{sale:N}:idem`); this column is what a rebuild of the sale restores them from
-- after a wipe or a restart that lost them. One order per (sale, buyer, key).
ALTER TABLE orders ADD COLUMN idempotency_key TEXT
    CHECK (idempotency_key IS NULL OR length(idempotency_key) BETWEEN 1 AND 64);

CREATE UNIQUE INDEX orders_purchase_key ON orders (sale_id, user_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
