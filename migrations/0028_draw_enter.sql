-- A batch of draw entries in one call (src/sale/draw/enter.rs): the draw's lock
-- held shared, the draw's window read by Postgres's clock, the entries made
-- before read, the rest written, and those another batch wrote meanwhile read,
-- in one round trip where the server sent seven (BEGIN, the lock, the window, the
-- read, the INSERT, COMMIT).
--
-- Answers one row `('no_draw' | 'closed' | 'not_open', opens_in_ms)` when the
-- batch cannot enter, else one row `('entry', NULL, user, entry id, entered at)`
-- per entry (a user may come twice: the same entry).
--
-- The entries made before are looked up one user at a time by the primary key
-- (a LATERAL look-up), never found by filtering the sale's entries: with the
-- statistics of a table that has just begun to fill, the planner took
-- `user_id = ANY(...)` for a filter on all of the sale's entries (about 16 ms a
-- batch at 100,000 entries, where a look-up each takes a few µs).
-- The LATERAL subquery with its LIMIT cannot be turned into a join, so its plan
-- is the per-user look-up whatever the estimates; `enable_seqscan = off` keeps a
-- plan cached while the table was tiny from scanning it for each user instead.
-- The function's plans are cached (planned anew each call, with
-- `plan_cache_mode = force_custom_plan`, planning was a third of Postgres's time
-- in an entry storm).
CREATE FUNCTION draw_enter(p_sale bigint, p_users bigint[], p_lock_class integer, p_lock_key integer)
RETURNS TABLE (answer text, opens_in_ms float8, entrant bigint, entry bigint, made_at timestamptz)
LANGUAGE plpgsql VOLATILE
SET enable_seqscan = off
AS $$
#variable_conflict use_column
DECLARE
    v_before_draw boolean;
    v_opened boolean;
    v_opens_in float8;
    v_asked integer;
    v_answered integer;
BEGIN
    -- The draw takes this lock alone, and only once its time has passed: an entry
    -- either is in the draw or is refused `entries_closed`.
    PERFORM pg_advisory_xact_lock_shared(p_lock_class, p_lock_key);
    SELECT d.drawn_at IS NULL AND clock_timestamp() < s.starts_at,
           clock_timestamp() >= s.entries_open_at,
           EXTRACT(EPOCH FROM s.entries_open_at - clock_timestamp())::float8 * 1000
      INTO v_before_draw, v_opened, v_opens_in
      FROM sale_draws d JOIN sales s ON s.id = d.sale_id
     WHERE d.sale_id = p_sale;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'no_draw'::text, NULL::float8, NULL::bigint, NULL::bigint, NULL::timestamptz;
        RETURN;
    END IF;
    IF NOT v_before_draw THEN
        RETURN QUERY SELECT 'closed'::text, NULL::float8, NULL::bigint, NULL::bigint, NULL::timestamptz;
        RETURN;
    END IF;
    IF NOT v_opened THEN
        RETURN QUERY SELECT 'not_open'::text, v_opens_in, NULL::bigint, NULL::bigint, NULL::timestamptz;
        RETURN;
    END IF;
    SELECT count(DISTINCT u) INTO v_asked FROM unnest(p_users) AS u;
    -- Written in user order, so two batches that share users wait for each
    -- other's rows in one order (never a deadlock).
    RETURN QUERY
    WITH asked AS (
        SELECT DISTINCT u FROM unnest(p_users) AS u
    ), before AS (
        SELECT a.u, e.id, e.entered_at
          FROM asked a
          CROSS JOIN LATERAL (
              SELECT de.id, de.entered_at FROM draw_entries de
               WHERE de.sale_id = p_sale AND de.user_id = a.u
               LIMIT 1) e
    ), written AS (
        INSERT INTO draw_entries (sale_id, user_id)
        SELECT p_sale, a.u FROM asked a
         WHERE NOT EXISTS (SELECT 1 FROM before b WHERE b.u = a.u)
         ORDER BY a.u
        ON CONFLICT (sale_id, user_id) DO NOTHING
        RETURNING user_id, id, entered_at
    )
    SELECT 'entry'::text, NULL::float8, b.u, b.id, b.entered_at FROM before b
    UNION ALL
    SELECT 'entry'::text, NULL::float8, w.user_id, w.id, w.entered_at FROM written w;
    GET DIAGNOSTICS v_answered = ROW_COUNT;
    IF v_answered < v_asked THEN
        -- Entered meanwhile by another batch (the same user on another worker): its
        -- rows are committed (ON CONFLICT waited for them), and this statement's
        -- snapshot sees them. Those answered above come again, the same entries.
        RETURN QUERY
        SELECT 'entry'::text, NULL::float8, u, e.id, e.entered_at
          FROM unnest(p_users) AS u
          CROSS JOIN LATERAL (
              SELECT de.id, de.entered_at FROM draw_entries de
               WHERE de.sale_id = p_sale AND de.user_id = u
               LIMIT 1) e;
    END IF;
END;
$$;
