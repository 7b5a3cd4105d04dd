-- A draw's whole seeded order, one row per entry, written once by the draw in
-- the order's own sequence (so both indexes only ever append: a million entries
-- in about two seconds, where setting `draw_entries.rank` on every row took
-- fifteen). `key8` is the first 8 bytes of the entry's key (see
-- src/sale/draw/order.rs) as a signed number that sorts as the bytes do: an
-- entry's place is found from its key, computed from the seed, with no index on
-- the entry. `draw_entries.rank` is now set only on the entries offered a win.
CREATE TABLE draw_order (
    sale_id  bigint  NOT NULL,
    rank     integer NOT NULL,
    key8     bigint  NOT NULL,
    entry_id bigint  NOT NULL,
    PRIMARY KEY (sale_id, rank)
);
CREATE INDEX draw_order_key ON draw_order (sale_id, key8);

-- Draws made before this version ranked every entry in `draw_entries`; their
-- order is copied here, and their places are read from `draw_entries.rank`, so
-- the stand-in key (the rank) is never looked up.
INSERT INTO draw_order (sale_id, rank, key8, entry_id)
SELECT sale_id, rank, rank, id FROM draw_entries WHERE rank IS NOT NULL;
