-- The last foreign key of `orders`, on `cancelled_by` (migration 0009), which 0012
-- missed. Postgres queues its trigger for every inserted row, even one whose
-- `cancelled_by` is NULL, as every order settlement writes is: about 0.7 us per
-- row, of 8 to 9 (see docs/capacity.md). What it guarded:
--   * `cancelled_by` is written only by a cancel (src/sale/cancel.rs), with the id
--     of the signed-in buyer or admin making it;
--   * the only users ever deleted are rehearsal ones, and the rehearsal cleanup
--     keeps every user an order's `cancelled_by` names (src/sale/rehearsal.rs).
ALTER TABLE orders DROP CONSTRAINT IF EXISTS orders_cancelled_by_fkey;
