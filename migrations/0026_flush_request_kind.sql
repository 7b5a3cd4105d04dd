-- Servers keep the votes they accepted until settlement has committed them, as
-- they keep orders (src/settle/kept.rs): a flush request now names what it asks
-- for, a sale or a poll (`sale_id` then holds the poll's id).
ALTER TABLE flush_requests
    ADD COLUMN kind text NOT NULL DEFAULT 'sale' CHECK (kind IN ('sale', 'poll'));
