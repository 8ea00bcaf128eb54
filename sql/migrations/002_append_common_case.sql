-- append_events in two steps: the common case in lean statements, and the full check only
-- when that case does not hold (docs/architecture.md, "The append transaction").
--
-- Nearly every call appends events with new ids to streams at the version the writer expects,
-- claiming no transaction the ledger knows. The full check (001) looks every event id up in the
-- log to tell a retry from a conflict, and every stream's version up, a new stream's too, before
-- writing. Here the common case skips those lookups and lets the log's unique keys refuse what
-- it does not cover: a stored event id, or a stream that exists where none was expected, is a
-- unique violation that undoes the lean step (its own subtransaction). A stream that moved
-- or a claimed transaction known meanwhile makes it write nothing. Either way the full check then
-- gives each write its verdict, as before, in the same transaction. Answers as in 001.
-------------------------------------------------------------------------------------------------

ALTER PROCEDURE append_events RENAME TO append_events_checked;

CREATE PROCEDURE append_events(
    p_units integer[], p_streams text[], p_expected bigint[],
    p_event_ids uuid[], p_types text[], p_data jsonb[], p_metadata jsonb[], p_claims text[],
    p_order_writes integer[], p_order_new boolean[], p_order_ids text[], p_order_users text[], p_order_products text[],
    p_order_quantities integer[], p_order_prices text[], p_order_currencies text[], p_order_tokens uuid[],
    p_order_states text[], p_order_versions bigint[], p_order_transactions text[], p_order_created bigint[],
    p_order_updated bigint[], p_order_queued bigint[], p_order_before_refund text[], p_order_failures text[],
    p_transaction_writes integer[], p_transaction_new boolean[], p_transaction_ids text[], p_transaction_orders text[],
    p_transaction_users text[], p_transaction_products text[], p_transaction_purchased bigint[],
    p_transaction_environments text[], p_transaction_statuses text[], p_transaction_received bigint[],
    p_transaction_updated bigint[], p_transaction_originals text[], p_transaction_apps text[], p_transaction_tokens uuid[],
    p_transaction_matched_by text[], p_transaction_verifications text[],
    p_recorded_at bigint, p_commit boolean,
    INOUT r_status text[] DEFAULT NULL, INOUT r_detail text[] DEFAULT NULL,
    INOUT r_versions bigint[] DEFAULT NULL, INOUT r_positions bigint[] DEFAULT NULL)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_xid bigint := pg_current_xact_id()::text::bigint;
    v_taken boolean := false;
BEGIN
    -- As in append_events_checked (001), which the uncommon case calls: index lookups only, the
    -- generic plans kept, and the streams' locks.
    PERFORM set_config('enable_seqscan', 'off', true);
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);
    PERFORM pg_advisory_xact_lock(l.h)
       FROM (SELECT DISTINCT hashtextextended(s, 0) AS h
               FROM unnest(p_streams || ARRAY(SELECT 'transaction-' || c FROM unnest(p_claims) AS c WHERE c <> '')) AS s
              ORDER BY 1 OFFSET 0) AS l;

    -- The common case. A write passes when each of its streams is at the version expected (a new
    -- stream is not looked up: if it exists, its version 0 is a unique violation) and no
    -- transaction it claims is known; when one does not, the statement writes nothing. A stored
    -- event id is a unique violation too, which undoes everything the block wrote.
    BEGIN
        WITH given AS (
            SELECT g.n, g.stream, g.expected, g.id, g.type, g.data, g.metadata,
                   row_number() OVER (PARTITION BY g.stream ORDER BY g.n) AS k
              FROM unnest(p_streams, p_expected, p_event_ids, p_types, p_data, p_metadata)
                   WITH ORDINALITY AS g(stream, expected, id, type, data, metadata, n)
        ), streams AS (
            SELECT s.stream, s.expected,
                   CASE WHEN s.expected = -1 THEN -1
                        ELSE coalesce((SELECT max(e.stream_version) FROM events e WHERE e.stream_id = s.stream), -1) END AS current
              FROM (SELECT DISTINCT g.stream, g.expected FROM given g) AS s
        ), common AS (
            -- (and one expected version per stream, as the writer's groups have)
            SELECT (SELECT count(*) FROM streams) = (SELECT count(DISTINCT g.stream) FROM given g)
                   AND NOT EXISTS (SELECT 1 FROM streams s WHERE s.expected <> -2 AND s.expected <> s.current)
                   AND NOT EXISTS (SELECT 1 FROM unnest(p_claims) AS c
                                    WHERE c <> '' AND (SELECT true FROM apple_transactions t WHERE t.transaction_id = c))
                   AS holds
        ), placed AS (
            -- The position rule as in append_events_checked.
            SELECT g.*, s.current + g.k AS version,
                   coalesce((SELECT max(e.global_position) + 1 FROM events e
                              WHERE e.global_position >= (v_xid << 12) AND e.global_position < ((v_xid + 1) << 12)), v_xid << 12)
                   + g.n - 1 AS position
              FROM given g JOIN streams s USING (stream)
             WHERE (SELECT holds FROM common)
        ), appended AS (
            INSERT INTO events (global_position, stream_id, stream_version, event_id, type, data, metadata, recorded_at, transaction_id)
            SELECT p.position, p.stream, p.version, p.id, p.type, p.data, coalesce(p.metadata, '{}'::jsonb),
                   ledger_time(p_recorded_at), v_xid::text::xid8
              FROM placed p
        )
        SELECT (SELECT holds FROM common), array_agg(p.version ORDER BY p.n), array_agg(p.position ORDER BY p.n)
          INTO v_taken, r_versions, r_positions
          FROM placed p;

        -- The rows the writes leave, each table in a statement of its own, run only when the call
        -- has rows for it: most calls have no transaction rows, a plain stream's none at all.
        IF v_taken AND cardinality(p_order_ids) > 0 THEN
            WITH order_rows AS (
                SELECT x.is_new, x.order_id, x.user_id, x.product_id, x.quantity, nullif(x.price, '')::numeric AS price,
                       nullif(x.currency, '') AS currency, x.app_account_token, x.state, x.version,
                       nullif(x.transaction_id, '') AS transaction_id, ledger_time(x.created_at) AS created_at,
                       ledger_time(x.updated_at) AS updated_at, ledger_time(nullif(x.queued_at, -9223372036854775808)) AS queued_at,
                       nullif(x.state_before_refund, '') AS state_before_refund, nullif(x.failure_reason, '') AS failure_reason
                  FROM unnest(p_order_new, p_order_ids, p_order_users, p_order_products, p_order_quantities,
                              p_order_prices, p_order_currencies, p_order_tokens, p_order_states, p_order_versions,
                              p_order_transactions, p_order_created, p_order_updated, p_order_queued, p_order_before_refund,
                              p_order_failures)
                       AS x(is_new, order_id, user_id, product_id, quantity, price, currency, app_account_token, state, version,
                            transaction_id, created_at, updated_at, queued_at, state_before_refund, failure_reason)
            ), new_orders AS (
                INSERT INTO orders (order_id, user_id, product_id, quantity, price, currency, app_account_token, state, version,
                                    transaction_id, created_at, updated_at, queued_at, state_before_refund, failure_reason)
                SELECT x.order_id, x.user_id, x.product_id, x.quantity, x.price, x.currency, x.app_account_token, x.state, x.version,
                       x.transaction_id, x.created_at, x.updated_at, x.queued_at, x.state_before_refund, x.failure_reason
                  FROM order_rows x
                 WHERE x.is_new
            )
            UPDATE orders o
               SET user_id = x.user_id, product_id = x.product_id, quantity = x.quantity, price = x.price, currency = x.currency,
                   app_account_token = x.app_account_token, state = x.state, version = x.version, transaction_id = x.transaction_id,
                   created_at = x.created_at, updated_at = x.updated_at, queued_at = x.queued_at,
                   state_before_refund = x.state_before_refund, failure_reason = x.failure_reason
              FROM order_rows x
             WHERE o.order_id = x.order_id AND NOT x.is_new;
        END IF;

        IF v_taken AND cardinality(p_transaction_ids) > 0 THEN
            WITH transaction_rows AS (
                SELECT x.is_new, x.transaction_id, nullif(x.order_id, '') AS order_id, nullif(x.user_id, '') AS user_id,
                       x.product_id, ledger_time(x.purchase_date) AS purchase_date, nullif(x.environment, '') AS environment, x.status,
                       ledger_time(x.received_at) AS received_at, ledger_time(x.updated_at) AS updated_at,
                       nullif(x.original_transaction_id, '') AS original_transaction_id,
                       nullif(x.app_transaction_id, '') AS app_transaction_id,
                       nullif(x.app_account_token, '00000000-0000-0000-0000-000000000000') AS app_account_token,
                       nullif(x.matched_by, '') AS matched_by, nullif(x.verification, '')::jsonb AS verification
                  FROM unnest(p_transaction_new, p_transaction_ids, p_transaction_orders, p_transaction_users,
                              p_transaction_products, p_transaction_purchased, p_transaction_environments, p_transaction_statuses,
                              p_transaction_received, p_transaction_updated, p_transaction_originals, p_transaction_apps,
                              p_transaction_tokens, p_transaction_matched_by, p_transaction_verifications)
                       AS x(is_new, transaction_id, order_id, user_id, product_id, purchase_date, environment, status, received_at,
                            updated_at, original_transaction_id, app_transaction_id, app_account_token, matched_by, verification)
            ), new_transactions AS (
                INSERT INTO apple_transactions (transaction_id, order_id, user_id, product_id, purchase_date, environment, status,
                                                received_at, updated_at, original_transaction_id, app_transaction_id, app_account_token,
                                                matched_by, verification)
                SELECT x.transaction_id, x.order_id, x.user_id, x.product_id, x.purchase_date, x.environment, x.status, x.received_at,
                       x.updated_at, x.original_transaction_id, x.app_transaction_id, x.app_account_token, x.matched_by, x.verification
                  FROM transaction_rows x
                 WHERE x.is_new
            )
            UPDATE apple_transactions t
               SET order_id = x.order_id, user_id = x.user_id, product_id = x.product_id, purchase_date = x.purchase_date,
                   environment = x.environment, status = x.status, received_at = x.received_at, updated_at = x.updated_at,
                   original_transaction_id = x.original_transaction_id, app_transaction_id = x.app_transaction_id,
                   app_account_token = x.app_account_token, matched_by = x.matched_by, verification = x.verification
              FROM transaction_rows x
             WHERE t.transaction_id = x.transaction_id AND NOT x.is_new;
        END IF;
    EXCEPTION WHEN unique_violation THEN
        v_taken := false;
    END;

    -- Otherwise the full check of each write, its verdict, and the writes that pass.
    IF v_taken THEN
        r_status := array_fill('appended'::text, ARRAY[cardinality(p_claims)]);
        r_detail := array_fill(''::text, ARRAY[cardinality(p_claims)]);
    ELSE
        CALL append_events_checked(p_units, p_streams, p_expected, p_event_ids, p_types, p_data, p_metadata, p_claims,
            p_order_writes, p_order_new, p_order_ids, p_order_users, p_order_products, p_order_quantities, p_order_prices,
            p_order_currencies, p_order_tokens, p_order_states, p_order_versions, p_order_transactions, p_order_created,
            p_order_updated, p_order_queued, p_order_before_refund, p_order_failures,
            p_transaction_writes, p_transaction_new, p_transaction_ids, p_transaction_orders, p_transaction_users,
            p_transaction_products, p_transaction_purchased, p_transaction_environments, p_transaction_statuses,
            p_transaction_received, p_transaction_updated, p_transaction_originals, p_transaction_apps, p_transaction_tokens,
            p_transaction_matched_by, p_transaction_verifications, p_recorded_at, false,
            r_status, r_detail, r_versions, r_positions);
    END IF;

    IF p_commit THEN
        COMMIT;
    END IF;
END
$fn$;
