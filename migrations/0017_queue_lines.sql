-- An admin's controls of a waiting room's line (issue 50, src/sale/queue/line.rs):
-- admissions paused, the line closed to new joins. Redis holds them in the sale's
-- meta hash (`q_paused`, `q_closed`), where the scripts read them; this row is what
-- a sale's rebuild writes back. No row: neither.
CREATE TABLE queue_lines (
    sale_id      bigint PRIMARY KEY,
    paused       boolean NOT NULL DEFAULT false,
    joins_closed boolean NOT NULL DEFAULT false,
    updated_at   timestamptz NOT NULL DEFAULT now()
);
