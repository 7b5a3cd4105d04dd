-- Units offered and units returned (issue 50). `stock_total` has counted every unit
-- ever offered, and on a sale whose buyers may not buy again an order's returned
-- unit (cancelled, refunded or expired) is offered again, so `stock_total` grew by
-- it: a 100-unit sale read "97 of 104 left". Those re-offers are now counted apart:
-- `units_reoffered` moves with `stock_total` on each applied return, in the same
-- update, so the internal arithmetic (`stock_total = units left + buyers' units` in
-- both stores) is untouched, and what the admin offered, shown everywhere as
-- `stock_total`, is `stock_total - units_reoffered`.
ALTER TABLE sales ADD COLUMN units_reoffered BIGINT NOT NULL DEFAULT 0
    CHECK (units_reoffered >= 0);

UPDATE sales s SET units_reoffered = r.delta
FROM (SELECT sale_id, sum(delta) AS delta FROM stock_changes
      WHERE kind = 'return' AND status = 'applied' AND delta > 0
      GROUP BY sale_id) r
WHERE r.sale_id = s.id;
