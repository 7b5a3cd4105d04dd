-- Cancel and refund (issue 25): the `Idempotency-Key` of the cancel that cancelled
-- the order, if it sent one. A repeat of that cancel (the same caller, the same
-- key) on the cancelled or refunded order answers the same 200 again, marked
-- `Idempotent-Replayed: true`; any other cancel of it is 409 `not_cancellable`.
-- Keys are per order: the answer is rebuilt from the order's row (its status,
-- `cancelled_at`, `quantity`, and the refunded payments), so nothing else is stored.
ALTER TABLE orders ADD COLUMN cancel_key TEXT;
