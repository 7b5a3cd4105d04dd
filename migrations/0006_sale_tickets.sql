-- Whether a purchase must carry a ticket (POST /api/sales/{id}/ticket, issued only
-- once the sale is open): chosen when the sale is created, never changed after.
-- Sales made before tickets existed keep selling without one; the API makes new
-- sales require one unless told otherwise.
ALTER TABLE sales
    ADD COLUMN requires_ticket BOOLEAN NOT NULL DEFAULT FALSE;
