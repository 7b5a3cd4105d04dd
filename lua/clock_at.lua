-- The Redis clock in ms, read on the node that holds KEYS[1] (a poll's meta hash):
-- the clock its vote script stamps votes with. Reads and writes nothing else.
-- An admin's close of a poll is stamped with it once Redis took the close, so no
-- vote accepted before the close carries a later time than the close.
return clock_ms('')
