-- Settlement writes every accepted order, tens of thousands a second in a storm
-- (issue 27). The two foreign keys of `orders` ran a trigger per inserted row, each a
-- query locking the referenced sale and user row: 4 of the 11 microseconds Postgres
-- spent per settled order. They go; what they guarded is guarded where rows are
-- written and removed:
--   * settlement's insert joins `sales` and `users` (src/sale/settlement.rs): an
--     order of a sale or user that is gone is not written, and is logged loudly;
--   * a sale is deleted only when it has no order, in Postgres or in Redis
--     (src/sale/lifecycle.rs, lua/delete_sale.lua, under the sale's row lock);
--   * the rehearsal cleanup deletes a sale's orders before the sale and keeps every
--     user an order refers to (src/sale/rehearsal.rs).
ALTER TABLE orders DROP CONSTRAINT IF EXISTS orders_sale_id_fkey;
ALTER TABLE orders DROP CONSTRAINT IF EXISTS orders_user_id_fkey;
