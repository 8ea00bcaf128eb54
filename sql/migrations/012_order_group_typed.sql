-- A leaner order group commit (docs/architecture.md, "Order events in groups"), replacing
-- append_orders_durably for the server (which keeps it for servers of the previous version during
-- a rolling upgrade; nothing of this version calls it): the same writes in fewer and cheaper
-- statements, and a group that no longer fails as a whole, nor needs the caller to read first,
-- for the cases a writer that remembers its orders meets.
--
-- Measured with pg_stat_statements during `ledger bench http` at 32 clients (14.5 appends per
-- group), append_orders_durably spent 1.83 ms per CALL: 0.50 in append_batch (a set-returning
-- function whose rows were aggregated again), 0.37 in the orders upsert from jsonb_to_recordset
-- (each row parsed from JSON, then a speculative insert that conflicts), and the rest in six
-- more statements and the commit. Here:
--   * the order rows come as typed arrays, not JSON: an existing order is an UPDATE, a new one an
--     INSERT (no speculative insertion);
--   * the events are inserted here, one statement, positions as append_batch gives them
--     (transaction id * 4096 + n);
--   * the stored data and metadata of a creation are the parameters' jsonb as text (what the row
--     holds), not read back from the log.
--
-- Appends i = 1..n each hold one event of the order p_orders[i] (stream p_streams[i]) decided on
-- version p_expected[i] (-1: no order yet). An append is taken when that is still the stream's
-- version and, for a receipt that claims a transaction (p_claims[i] not ''), when the ledger
-- does not know that transaction yet; else nothing is written for it and its status is
-- 'refused': the caller writes it alone, which gives every answer (a retried creation, a
-- conflict, a transaction already held) as before. An event id, an app account token or a claimed
-- transaction id taken meanwhile (or a second transaction for one order) is still a unique
-- violation that rolls the whole group back (the caller then writes each append alone); a stream
-- version is not, since versions are checked under the streams' advisory locks, which every
-- appender takes.
--
-- The order rows are what `evolve` left: for a new order every column, for an existing one the
-- columns an event changes (state, transaction, queued time, state before a refund, failure
-- reason); version is p_expected[i] + 1 and updated_at this transaction's time, as is created_at
-- of a new order. Optional text comes as '' for none (no identifier, price, currency or reason
-- is empty), an optional time with a flag. p_claim_rows: the transactions claimed, a JSON array
-- of apple_transactions rows, each with `n`, the index of its append.
--
-- Locks: the orders' rows first, in order id order, then the streams' advisory locks in hash
-- order: the order the single-order path takes them in, so the two never deadlock.
--
-- Answers, per append: r_status ('appended' or 'refused'), r_position (-1 when refused), and for
-- a creation appended the stored data and metadata text ('' otherwise); and the transaction's time.

CREATE PROCEDURE append_order_group(
    p_orders text[], p_streams text[], p_expected bigint[], p_event_ids uuid[], p_types text[],
    p_data jsonb[], p_metadata jsonb[],
    p_user_ids text[], p_product_ids text[], p_quantities integer[], p_prices text[], p_currencies text[],
    p_tokens uuid[], p_states text[], p_transaction_ids text[], p_queued boolean[], p_queued_at timestamptz[],
    p_states_before_refund text[], p_failure_reasons text[],
    p_claims text[], p_claim_rows jsonb,
    INOUT r_status text[] DEFAULT NULL, INOUT r_position bigint[] DEFAULT NULL,
    INOUT r_data text[] DEFAULT NULL, INOUT r_metadata text[] DEFAULT NULL, INOUT r_now timestamptz DEFAULT NULL)
LANGUAGE plpgsql
AS $fn$
DECLARE
    v_xid  bigint := pg_current_xact_id()::text::bigint;
    v_next bigint;
    v_ok   boolean[];
BEGIN
    -- As append_batch's SET clause (which a procedure that commits cannot have): a plan cached
    -- while the tables were small must not keep scanning them whole once they are large. And
    -- the plans kept, not planned again for every CALL's arrays: PostgreSQL's default tries a
    -- custom plan each time (measured with pgbench, a one-event CALL: 0.96 -> 0.58 ms; bench http at 8 clients: PostgreSQL CPU per event 344-399 -> 176-204 us).
    PERFORM set_config('enable_seqscan', 'off', true);
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    r_now := now();
    PERFORM 1 FROM orders o WHERE o.order_id = ANY (p_orders) ORDER BY o.order_id FOR UPDATE;
    PERFORM pg_advisory_xact_lock(h)
       FROM (SELECT DISTINCT hashtextextended(s, 0) AS h FROM unnest(p_streams) AS s ORDER BY 1 OFFSET 0) AS locks;

    -- Which appends are taken, and their positions in the log, in one statement.
    v_next := coalesce((SELECT max(e.global_position) + 1 FROM events e
                         WHERE e.global_position >= (v_xid << 12) AND e.global_position < ((v_xid + 1) << 12)),
                       v_xid << 12);
    SELECT array_agg(w.ok ORDER BY w.n),
           array_agg(CASE WHEN w.ok THEN v_next + w.taken - 1 ELSE -1 END ORDER BY w.n)
      INTO v_ok, r_position
      FROM (SELECT t.n, t.ok, sum(t.ok::integer) OVER (ORDER BY t.n) AS taken
              FROM (SELECT a.n,
                           coalesce((SELECT max(e.stream_version) FROM events e WHERE e.stream_id = a.stream), -1) = a.expected
                           -- A scalar subquery, not NOT EXISTS: the planner may hash an EXISTS
                           -- over the whole table (measured: 1.7 ms a group once it held 4,000 rows).
                           AND (a.claim = ''
                                OR (SELECT true FROM apple_transactions k WHERE k.transaction_id = a.claim) IS NULL) AS ok
                      FROM unnest(p_streams, p_expected, p_claims) WITH ORDINALITY AS a(stream, expected, claim, n)) AS t) AS w;
    IF v_next + cardinality(p_streams) > ((v_xid + 1) << 12) THEN
        RAISE EXCEPTION 'a transaction appends at most 4096 events' USING ERRCODE = 'LE003';
    END IF;

    INSERT INTO events (global_position, stream_id, stream_version, event_id, type, data, metadata, transaction_id)
    SELECT r_position[i], p_streams[i], p_expected[i] + 1, p_event_ids[i], p_types[i], p_data[i],
           coalesce(p_metadata[i], '{}'::jsonb), v_xid::text::xid8
      FROM generate_subscripts(p_streams, 1) AS i
     WHERE v_ok[i];

    INSERT INTO orders (order_id, user_id, product_id, quantity, price, currency, app_account_token, state, version,
                        transaction_id, created_at, updated_at, queued_at, state_before_refund, failure_reason)
    SELECT p_orders[i], p_user_ids[i], p_product_ids[i], p_quantities[i], nullif(p_prices[i], '')::numeric,
           nullif(p_currencies[i], ''), p_tokens[i], p_states[i], 0, nullif(p_transaction_ids[i], ''), r_now, r_now,
           CASE WHEN p_queued[i] THEN p_queued_at[i] END, nullif(p_states_before_refund[i], ''),
           nullif(p_failure_reasons[i], '')
      FROM generate_subscripts(p_orders, 1) AS i
     WHERE v_ok[i] AND p_expected[i] = -1;

    UPDATE orders o
       SET state = u.state, version = u.expected + 1, transaction_id = nullif(u.transaction_id, ''), updated_at = r_now,
           queued_at = CASE WHEN u.queued THEN u.queued_at END, state_before_refund = nullif(u.before_refund, ''),
           failure_reason = nullif(u.failure, '')
      FROM unnest(p_orders, p_expected, p_states, p_transaction_ids, p_queued, p_queued_at, p_states_before_refund,
                  p_failure_reasons, v_ok) AS u(order_id, expected, state, transaction_id, queued, queued_at, before_refund, failure, ok)
     WHERE o.order_id = u.order_id AND u.ok AND u.expected >= 0;

    -- An order that already holds a transaction: the transaction's status follows the order.
    UPDATE apple_transactions a SET status = u.state, updated_at = r_now
      FROM unnest(p_transaction_ids, p_states, p_claims, v_ok) AS u(transaction_id, state, claim, ok)
     WHERE a.transaction_id = u.transaction_id AND u.ok AND u.claim = '' AND u.transaction_id <> '';

    -- Receipts are one append in six and their optional fields may be empty text: their rows come
    -- as JSON, as append_orders_durably took them.
    INSERT INTO apple_transactions (transaction_id, order_id, user_id, product_id, purchase_date, environment, status,
        received_at, updated_at, original_transaction_id, app_transaction_id, app_account_token, matched_by)
    SELECT c.transaction_id, c.order_id, c.user_id, c.product_id,
           timestamptz '2000-01-01 00:00:00+00' + c.purchase_date * interval '1 microsecond',
           c.environment, 'claimed', r_now, r_now, c.original_transaction_id, c.app_transaction_id,
           c.app_account_token, c.matched_by
      FROM jsonb_to_recordset(p_claim_rows) AS c(
           n integer, transaction_id text, order_id text, user_id text, product_id text, purchase_date bigint,
           environment text, original_transaction_id text, app_transaction_id text, app_account_token uuid,
           matched_by text)
     WHERE v_ok[c.n];

    SELECT array_agg(CASE WHEN v_ok[i] THEN 'appended' ELSE 'refused' END ORDER BY i),
           array_agg(CASE WHEN v_ok[i] AND p_expected[i] = -1 THEN p_data[i]::text ELSE '' END ORDER BY i),
           array_agg(CASE WHEN v_ok[i] AND p_expected[i] = -1 THEN coalesce(p_metadata[i], '{}'::jsonb)::text ELSE '' END ORDER BY i)
      INTO r_status, r_data, r_metadata
      FROM generate_subscripts(p_streams, 1) AS i;
    COMMIT;
END
$fn$;
