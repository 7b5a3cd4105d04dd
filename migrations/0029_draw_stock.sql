-- The units a draw divided among its first winners (`stock_total -
-- units_reoffered` at the draw), published with the draw so that its checks
-- (`stampede verify-draw`, "How this draw was made") compare the first winners
-- with the stock of that moment: a top-up, a cancel or a refund after the draw
-- moves the sale's stock, not the draw. Null for a draw made before this column
-- (the checks then use the sale's stock, as before).
ALTER TABLE sale_draws ADD COLUMN stock_at_draw bigint;
