-- When an admin closed a poll. `closed` alone could not tell a poll closed early
-- from one run out once its closing time had passed: the lists then said "Closed
-- <closing time>" for a poll closed hours before. Polls closed before this
-- column take the time of their first close from the admin history, where it is
-- kept; none there: NULL (the pages then say what they said before).
ALTER TABLE polls ADD COLUMN closed_at timestamptz;

UPDATE polls p
SET closed_at = (SELECT min(c.at) FROM admin_changes c
                 WHERE c.poll_id = p.id AND c.action = 'close')
WHERE p.closed;
