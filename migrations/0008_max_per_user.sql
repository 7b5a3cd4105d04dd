-- More than one unit per customer. `max_per_user` (1 by default, fixed at creation)
-- caps the units one buyer may hold in a sale; a purchase may ask for several at
-- once (`quantity`), all or nothing. A sale of one per customer keeps the buyers
-- set as its only per-user state; a sale of more keeps units per buyer in Redis
-- and one order row per accepted purchase here.
ALTER TABLE sales
    ADD COLUMN max_per_user INTEGER NOT NULL DEFAULT 1
        CHECK (max_per_user >= 1 AND max_per_user <= 100);

ALTER TABLE orders
    ADD COLUMN quantity INTEGER NOT NULL DEFAULT 1 CHECK (quantity >= 1),
    -- Set from the sale at settlement: its buyers may hold more than one order.
    ADD COLUMN multi_unit BOOLEAN NOT NULL DEFAULT FALSE;

-- One live order per buyer, on sales of one per customer.
DROP INDEX orders_one_live_per_buyer;
CREATE UNIQUE INDEX orders_one_live_per_buyer ON orders (sale_id, user_id)
    WHERE status <> 'expired' AND NOT multi_unit;
