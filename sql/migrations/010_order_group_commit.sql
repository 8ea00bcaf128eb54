-- The order ledger's group commit (docs/architecture.md, "Order events in groups"): order events
-- for different orders that arrive together, appended in one transaction with their projection
-- rows, committed before the answer. The caller read the orders (without locking them), decided
-- each event with `decide` and `evolve`, and sends what it decided with the version it decided
-- on; an order that moved on meanwhile is refused here by that expected version, and nothing is
-- written for it.
--
-- Appends i = 1..n each hold one event (p_streams[i], p_expected[i]: -1 = no stream yet, else the
-- version read). p_orders: a JSON array of the order rows the appends leave, each with `n`, the
-- index of its append. p_claims: the Apple transactions that receipt-received events claim, the
-- same way. A row is written only when its append was appended. Times are this transaction's
-- (`now()`, which the events record): an order row's updated_at, and its created_at at version 0,
-- as `evolve` sets them; the caller evolves its answer again with r_now. A claim is a plain
-- INSERT: a transaction id someone else recorded meanwhile is a unique violation, and the whole
-- group rolls back (the caller then writes each event on its own).
--
-- The orders' rows are locked first, in order id order, then the streams (by append_batch): the
-- order the single-order path takes them in, so the two never deadlock each other.
--
-- Answers append_batch's rows as parallel arrays, without NULLs ('' and -1 for none), with the
-- stored data and metadata text of events at version 0 (a creation, which the API answers with
-- the order's history), and the transaction's time.

CREATE PROCEDURE append_orders_durably(
    p_streams text[], p_expected bigint[], p_event_ids uuid[], p_types text[], p_data jsonb[], p_metadata jsonb[],
    p_orders jsonb, p_claims jsonb,
    INOUT r_append integer[] DEFAULT NULL, INOUT r_status text[] DEFAULT NULL,
    INOUT r_stream_version bigint[] DEFAULT NULL, INOUT r_global_position bigint[] DEFAULT NULL,
    INOUT r_data text[] DEFAULT NULL, INOUT r_metadata text[] DEFAULT NULL, INOUT r_now timestamptz DEFAULT NULL)
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_appended integer[];
BEGIN
    -- As append_batch's SET clause (which a procedure that commits cannot have): a plan cached
    -- while the tables were small must not keep scanning them whole once they are large.
    PERFORM set_config('enable_seqscan', 'off', true);
    r_now := now();
    PERFORM 1 FROM orders o
     WHERE o.order_id = ANY (ARRAY(SELECT x.order_id FROM jsonb_to_recordset(p_orders) AS x(order_id text)))
     ORDER BY o.order_id FOR UPDATE;

    SELECT array_agg(b.r_append ORDER BY b.n), array_agg(b.r_status ORDER BY b.n),
           array_agg(coalesce(b.r_stream_version, -1) ORDER BY b.n), array_agg(coalesce(b.r_global_position, -1) ORDER BY b.n)
      INTO r_append, r_status, r_stream_version, r_global_position
      FROM append_batch(p_streams, p_expected, array_fill(1, ARRAY[cardinality(p_streams)]),
                        p_event_ids, p_types, p_data, p_metadata)
           WITH ORDINALITY AS b(r_append, r_status, r_detail, r_event_id, r_stream_version, r_global_position, n);
    v_appended := ARRAY(SELECT a FROM unnest(r_append, r_status) AS u(a, s) WHERE s = 'appended');

    INSERT INTO orders (order_id, user_id, product_id, quantity, price, currency, app_account_token, state, version,
                        transaction_id, created_at, updated_at, queued_at, state_before_refund, failure_reason)
    SELECT x.order_id, x.user_id, x.product_id, x.quantity, x.price::numeric, x.currency, x.app_account_token,
           x.state, x.version, x.transaction_id,
           CASE WHEN x.version = 0 THEN r_now ELSE timestamptz '2000-01-01 00:00:00+00' + x.created_at * interval '1 microsecond' END,
           r_now,
           timestamptz '2000-01-01 00:00:00+00' + x.queued_at * interval '1 microsecond',
           x.state_before_refund, x.failure_reason
      FROM jsonb_to_recordset(p_orders) AS x(
           n integer, order_id text, user_id text, product_id text, quantity integer, price text, currency text,
           app_account_token uuid, state text, version bigint, transaction_id text, created_at bigint,
           queued_at bigint, state_before_refund text, failure_reason text)
     WHERE x.n = ANY (v_appended)
    ON CONFLICT (order_id) DO UPDATE SET
        state = EXCLUDED.state, version = EXCLUDED.version, transaction_id = EXCLUDED.transaction_id,
        updated_at = EXCLUDED.updated_at, queued_at = EXCLUDED.queued_at,
        state_before_refund = EXCLUDED.state_before_refund, failure_reason = EXCLUDED.failure_reason;

    -- An order that already holds a transaction: the transaction's status follows the order.
    UPDATE apple_transactions a SET status = x.state, updated_at = r_now
      FROM jsonb_to_recordset(p_orders) AS x(n integer, transaction_id text, state text, claims boolean)
     WHERE a.transaction_id = x.transaction_id AND x.n = ANY (v_appended) AND NOT x.claims;

    INSERT INTO apple_transactions (transaction_id, order_id, user_id, product_id, purchase_date, environment, status,
        received_at, updated_at, original_transaction_id, app_transaction_id, app_account_token, matched_by)
    SELECT c.transaction_id, c.order_id, c.user_id, c.product_id,
           timestamptz '2000-01-01 00:00:00+00' + c.purchase_date * interval '1 microsecond',
           c.environment, 'claimed', r_now, r_now, c.original_transaction_id, c.app_transaction_id,
           c.app_account_token, c.matched_by
      FROM jsonb_to_recordset(p_claims) AS c(
           n integer, transaction_id text, order_id text, user_id text, product_id text, purchase_date bigint,
           environment text, original_transaction_id text, app_transaction_id text, app_account_token uuid,
           matched_by text)
     WHERE c.n = ANY (v_appended);

    SELECT array_agg(coalesce(e.data::text, '') ORDER BY u.n), array_agg(coalesce(e.metadata::text, '') ORDER BY u.n)
      INTO r_data, r_metadata
      FROM unnest(r_status, r_stream_version, r_global_position) WITH ORDINALITY AS u(s, v, p, n)
      LEFT JOIN events e ON u.s = 'appended' AND u.v = 0 AND e.global_position = u.p;
    COMMIT;
END
$fn$;
