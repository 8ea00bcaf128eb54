-- What a writer reads before deciding, in one routine (docs/architecture.md, "The append
-- transaction"): the streams' locks first, when the caller asks for them, then the orders and
-- Apple transactions named, each transaction with its stream's version. A definition file
-- (sql/README.md): edit it in place, and the migrator applies it again.
--
-- A receipt locks its transaction and order, then reads them, in its own transaction. Sent as two
-- statements, that was a round trip more; and the read, sent alone, was planned afresh at every
-- call (its arrays make PostgreSQL prefer a custom plan), which cost more than running it. Here
-- the read runs after the locks are granted (each statement of a function takes a new snapshot),
-- with its plans kept and index lookups only, as in the append routine, and the caller's settings
-- put back.

CREATE OR REPLACE FUNCTION read_for_write(p_lock text[], p_orders text[], p_transactions text[])
RETURNS TABLE (o orders, t apple_transactions, transaction_version bigint)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_plans text := current_setting('plan_cache_mode');
    v_scans text := current_setting('enable_seqscan');
BEGIN
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true);
    -- The locks in append_events' order (hash order), so the two never deadlock.
    PERFORM pg_advisory_xact_lock(l.h)
       FROM (SELECT DISTINCT hashtextextended(s, 0) AS h FROM unnest(p_lock) AS s ORDER BY 1 OFFSET 0) AS l;
    RETURN QUERY SELECT x, NULL::apple_transactions, NULL::bigint FROM orders x WHERE x.order_id = ANY (p_orders);
    RETURN QUERY
        SELECT NULL::orders, x,
               coalesce((SELECT max(e.stream_version) FROM events e WHERE e.stream_id = 'transaction-' || x.transaction_id), -1)
          FROM apple_transactions x WHERE x.transaction_id = ANY (p_transactions);
    PERFORM set_config('plan_cache_mode', v_plans, true), set_config('enable_seqscan', v_scans, true);
END
$fn$;
