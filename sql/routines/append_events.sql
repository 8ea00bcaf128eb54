-- The append routine: every event the ledger stores goes through it (docs/architecture.md,
-- "The append transaction"). A definition file (sql/README.md): edit it in place, and the
-- migrator applies it again.
--
-- The caller (LedgerWriter) has read the orders and transactions its writes touch, decided each
-- order event with the state machine and computed the projection rows the writes leave. Here,
-- under the streams' advisory locks, each write is checked again and then stored whole or not at
-- all. A write is a group of appends (stream, expected version, events) and the rows they leave;
-- several writes share one call (group commit) and each gets its own verdict:
--   appended               every append found its stream at the expected version, nothing it
--                          claims is known yet, and none of its event ids is stored: its events
--                          and rows are written;
--   replayed               every event id is stored already, with the same stream, type and
--                          data (a retry, promise 3): nothing is written; r_versions and
--                          r_positions give the stored events;
--   event-id-conflict      an event id is stored with something else (r_detail: the id);
--   wrong-expected-version an append's stream moved (r_detail: see below);
--   claimed                a transaction the write claims as unknown is known now (r_detail: its id).
-- Only the first verdict writes anything, so one refused write never fails the others.
--
-- One entry per event: p_units (its write, 1-based), p_streams, p_expected (the version its
-- stream must be at: -2 any, -1 no stream yet, n its last version; the same for every event a
-- write appends to one stream), p_event_ids, p_types, p_data, p_metadata. One entry per write:
-- p_claims, '' or a transaction it takes while the ledger does not know it yet. p_order_* and
-- p_transaction_*: the rows the writes leave, one array per column (writes: the write a row
-- belongs to; new: insert, else update), times as microseconds since 2000-01-01 UTC, '' for text
-- that is absent (none the ledger keeps is empty), -9223372036854775808 for an absent time and
-- the nil UUID for an absent token. p_recorded_at: the events' recorded_at, as microseconds too
-- (the time the rows were computed at, so a replay of the log computes the same rows). p_commit:
-- COMMIT before answering (called outside a transaction block, so an acknowledged write is
-- durable, promise 2), or leave the caller's transaction open. Answers: r_status and r_detail per
-- write (r_detail of wrong-expected-version: '<current version> <stream>', -1 when the stream
-- does not exist), r_versions and r_positions per event (-1 where nothing is stored).
--
-- The checks come in two steps. Nearly every call appends events with new ids to streams at the
-- version the writer expects, claiming no transaction the ledger knows: step 1 writes that case
-- in lean statements and leaves what it does not look up to the log's unique keys. When the case
-- does not hold, step 2 looks every event id and stream up and gives each write its verdict.

-- A time the writer sends as microseconds since 2000-01-01 UTC. STABLE, as timestamptz + interval
-- is: so the planner inlines it where it is used.
CREATE OR REPLACE FUNCTION ledger_time(microseconds bigint) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $fn$
    SELECT timestamptz '2000-01-01 00:00:00+00' + microseconds * interval '1 microsecond'
$fn$;

-- Positions come from the writing transaction's id: global_position = xid * 4096 + n, where n
-- counts the events that transaction appended (001_baseline.sql, "The event log"). The routine
-- below is the one writer that places events; this is the readers' side of the same rule: the
-- highest position a gap-safe reader may return now. Every event at or below it is final.
CREATE OR REPLACE FUNCTION events_safe_position() RETURNS bigint
LANGUAGE sql STABLE AS $fn$
    SELECT (pg_snapshot_xmin(pg_current_snapshot())::text::bigint << 12) - 1
$fn$;

-- Its form before each transaction row carried its storefront (028_storefronts.sql).
DROP PROCEDURE IF EXISTS append_events(integer[], text[], bigint[], uuid[], text[], jsonb[], jsonb[], text[],
    integer[], boolean[], text[], text[], text[], integer[], text[], text[], uuid[], text[], bigint[], text[], bigint[],
    bigint[], bigint[], text[], text[], text[],
    integer[], boolean[], text[], text[], text[], text[], bigint[], text[], text[], bigint[], bigint[], text[], text[],
    uuid[], text[], text[], text[], bigint, boolean, text[], text[], bigint[], bigint[]);
-- Its form before each order and transaction row carried its app (013_app_columns.sql).
DROP PROCEDURE IF EXISTS append_events(integer[], text[], bigint[], uuid[], text[], jsonb[], jsonb[], text[],
    integer[], boolean[], text[], text[], text[], integer[], text[], text[], uuid[], text[], bigint[], text[], bigint[],
    bigint[], bigint[], text[], text[], integer[], boolean[], text[], text[], text[], text[], bigint[], text[], text[],
    bigint[], bigint[], text[], text[], uuid[], text[], text[], bigint, boolean, text[], text[], bigint[], bigint[]);

CREATE OR REPLACE PROCEDURE append_events(
    p_units integer[], p_streams text[], p_expected bigint[],
    p_event_ids uuid[], p_types text[], p_data jsonb[], p_metadata jsonb[], p_claims text[],
    p_order_writes integer[], p_order_new boolean[], p_order_ids text[], p_order_users text[], p_order_products text[],
    p_order_quantities integer[], p_order_prices text[], p_order_currencies text[], p_order_tokens uuid[],
    p_order_states text[], p_order_versions bigint[], p_order_transactions text[], p_order_created bigint[],
    p_order_updated bigint[], p_order_queued bigint[], p_order_before_refund text[], p_order_failures text[], p_order_bundles text[],
    p_transaction_writes integer[], p_transaction_new boolean[], p_transaction_ids text[], p_transaction_orders text[],
    p_transaction_users text[], p_transaction_products text[], p_transaction_purchased bigint[],
    p_transaction_environments text[], p_transaction_statuses text[], p_transaction_received bigint[],
    p_transaction_updated bigint[], p_transaction_originals text[], p_transaction_apps text[], p_transaction_tokens uuid[],
    p_transaction_matched_by text[], p_transaction_verifications text[], p_transaction_bundles text[],
    p_transaction_storefronts text[], p_recorded_at bigint, p_commit boolean,
    INOUT r_status text[] DEFAULT NULL, INOUT r_detail text[] DEFAULT NULL,
    INOUT r_versions bigint[] DEFAULT NULL, INOUT r_positions bigint[] DEFAULT NULL)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_xid bigint := pg_current_xact_id()::text::bigint;
    -- The position of this call's first event: every event it stores is v_first + (its ordinal
    -- among them) - 1.
    v_first bigint;
    v_taken boolean := false;
    -- What the app checks at the end refuse, and why.
    v_refused text;
    v_code text;
    -- The new orders whose token is their user's.
    v_user_token_orders text[];
BEGIN
    -- A procedure that may COMMIT cannot carry SET clauses. Every statement here is an index
    -- lookup: a plan cached while the log was small must not scan it whole once it is large. And
    -- generic plans, kept for the session, rather than a custom plan for every call's arrays.
    PERFORM set_config('enable_seqscan', 'off', true);
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);

    -- One writer per stream at a time, writers of other streams never wait; a claimed transaction
    -- is locked as its stream is. Taken in one order, so that two calls never deadlock, and
    -- before the statements below, which then read what committed before they got them. The
    -- Apple account of each transaction row written is locked as its stream (the links') is: a
    -- link and a tie of one account, or two ties of it, never both pass the account check below
    -- unseen by each other (issue 41).
    PERFORM pg_advisory_xact_lock(l.h)
       FROM (SELECT DISTINCT hashtextextended(s, 0) AS h
               FROM unnest(p_streams || ARRAY(SELECT 'transaction-' || c FROM unnest(p_claims) AS c WHERE c <> '')
                           || ARRAY(SELECT 'apple-account-' || a FROM unnest(p_transaction_apps) AS a WHERE a <> '')) AS s
              ORDER BY 1 OFFSET 0) AS l;

    -- The position rule, the only place a writer writes it: this transaction's id * 4096, past
    -- what an earlier call in the same transaction appended (4096 events a transaction at most:
    -- the table's check refuses more). Step 1 either stores nothing or is undone whole, so the
    -- rule holds for step 2 as well.
    v_first := coalesce((SELECT max(e.global_position) + 1 FROM events e
                          WHERE e.global_position >= (v_xid << 12) AND e.global_position < ((v_xid + 1) << 12)),
                        v_xid << 12);

    -- Step 1, the common case. A write passes when each of its streams is at the version expected
    -- (a new stream is not looked up: if it exists, its version 0 is a unique violation) and no
    -- transaction it claims is known; when one does not, the statement writes nothing. A stored
    -- event id is a unique violation too. A unique violation undoes everything the block wrote
    -- (its own subtransaction).
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
            SELECT g.*, s.current + g.k AS version, v_first + g.n - 1 AS position
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
                       nullif(x.state_before_refund, '') AS state_before_refund, nullif(x.failure_reason, '') AS failure_reason,
                       coalesce(nullif(x.bundle_id, ''), (SELECT f.bundle_id FROM ledger_first_app f WHERE f.only_row)) AS bundle_id
                  FROM unnest(p_order_new, p_order_ids, p_order_users, p_order_products, p_order_quantities,
                              p_order_prices, p_order_currencies, p_order_tokens, p_order_states, p_order_versions,
                              p_order_transactions, p_order_created, p_order_updated, p_order_queued, p_order_before_refund,
                              p_order_failures, p_order_bundles)
                       AS x(is_new, order_id, user_id, product_id, quantity, price, currency, app_account_token, state, version,
                            transaction_id, created_at, updated_at, queued_at, state_before_refund, failure_reason, bundle_id)
            ), new_orders AS (
                INSERT INTO orders (order_id, user_id, product_id, quantity, price, currency, app_account_token, state, version,
                                    transaction_id, created_at, updated_at, queued_at, state_before_refund, failure_reason, bundle_id)
                SELECT x.order_id, x.user_id, x.product_id, x.quantity, x.price, x.currency, x.app_account_token, x.state, x.version,
                       x.transaction_id, x.created_at, x.updated_at, x.queued_at, x.state_before_refund, x.failure_reason, x.bundle_id
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
                       nullif(x.matched_by, '') AS matched_by, nullif(x.verification, '')::jsonb AS verification,
                       coalesce(nullif(x.bundle_id, ''), (SELECT f.bundle_id FROM ledger_first_app f WHERE f.only_row)) AS bundle_id,
                       nullif(x.storefront, '') AS storefront
                  FROM unnest(p_transaction_new, p_transaction_ids, p_transaction_orders, p_transaction_users,
                              p_transaction_products, p_transaction_purchased, p_transaction_environments, p_transaction_statuses,
                              p_transaction_received, p_transaction_updated, p_transaction_originals, p_transaction_apps,
                              p_transaction_tokens, p_transaction_matched_by, p_transaction_verifications, p_transaction_bundles,
                              p_transaction_storefronts)
                       AS x(is_new, transaction_id, order_id, user_id, product_id, purchase_date, environment, status, received_at,
                            updated_at, original_transaction_id, app_transaction_id, app_account_token, matched_by, verification,
                            bundle_id, storefront)
            ), new_transactions AS (
                INSERT INTO apple_transactions (transaction_id, order_id, user_id, product_id, purchase_date, environment, status,
                                                received_at, updated_at, original_transaction_id, app_transaction_id, app_account_token,
                                                matched_by, verification, bundle_id, storefront)
                SELECT x.transaction_id, x.order_id, x.user_id, x.product_id, x.purchase_date, x.environment, x.status, x.received_at,
                       x.updated_at, x.original_transaction_id, x.app_transaction_id, x.app_account_token, x.matched_by, x.verification,
                       x.bundle_id, x.storefront
                  FROM transaction_rows x
                 WHERE x.is_new
            )
            UPDATE apple_transactions t
               SET order_id = x.order_id, user_id = x.user_id, product_id = x.product_id, purchase_date = x.purchase_date,
                   environment = x.environment, status = x.status, received_at = x.received_at, updated_at = x.updated_at,
                   original_transaction_id = x.original_transaction_id, app_transaction_id = x.app_transaction_id,
                   app_account_token = x.app_account_token, matched_by = x.matched_by, verification = x.verification,
                   bundle_id = x.bundle_id, storefront = x.storefront
              FROM transaction_rows x
             WHERE t.transaction_id = x.transaction_id AND NOT x.is_new;
        END IF;
    EXCEPTION WHEN unique_violation THEN
        v_taken := false;
    END;

    IF v_taken THEN
        r_status := array_fill('appended'::text, ARRAY[cardinality(p_claims)]);
        r_detail := array_fill(''::text, ARRAY[cardinality(p_claims)]);
    ELSE
        -- Step 2, the full check: the verdict on each write, the events and rows of those taken,
        -- and the answer, in one statement: its parts all read the log as it was before it. Every
        -- lookup is by a key of a row the call names, so the cost does not grow with the log.
        WITH given AS (
            SELECT g.n, g.unit, g.stream, g.expected, g.id, g.type, g.data, g.metadata
              FROM unnest(p_units, p_streams, p_expected, p_event_ids, p_types, p_data, p_metadata)
                   WITH ORDINALITY AS g(unit, stream, expected, id, type, data, metadata, n)
        ), streams AS (
            SELECT s.stream, coalesce((SELECT max(e.stream_version) FROM events e WHERE e.stream_id = s.stream), -1) AS current
              FROM (SELECT DISTINCT g.stream FROM given g) AS s
        ), stored AS (
            SELECT g.unit, count(*) AS found,
                   bool_and(e.stream_id = g.stream AND e.type = g.type AND e.data = g.data) AS same,
                   coalesce(min(e.event_id::text) FILTER (WHERE NOT (e.stream_id = g.stream AND e.type = g.type AND e.data = g.data)),
                            min(e.event_id::text)) AS conflict
              FROM given g JOIN events e ON e.event_id = g.id
             GROUP BY g.unit
        ), moved AS (
            SELECT DISTINCT ON (g.unit) g.unit, s.current || ' ' || g.stream AS detail
              FROM given g JOIN streams s USING (stream)
             WHERE g.expected <> -2 AND g.expected <> s.current
             ORDER BY g.unit, g.n
        ), known AS (
            SELECT c.unit::integer AS unit, c.claim
              FROM unnest(p_claims) WITH ORDINALITY AS c(claim, unit)
             WHERE c.claim <> '' AND (SELECT true FROM apple_transactions t WHERE t.transaction_id = c.claim)
        ), verdicts AS (
            SELECT w.unit,
                   CASE WHEN s.found = w.events AND s.same THEN 'replayed'
                        WHEN s.found > 0 THEN 'event-id-conflict'
                        WHEN m.unit IS NOT NULL THEN 'wrong-expected-version'
                        WHEN k.unit IS NOT NULL THEN 'claimed'
                        ELSE 'appended' END AS status,
                   CASE WHEN s.found = w.events AND s.same THEN ''
                        WHEN s.found > 0 THEN s.conflict
                        WHEN m.unit IS NOT NULL THEN m.detail
                        WHEN k.unit IS NOT NULL THEN k.claim
                        ELSE '' END AS detail
              FROM (SELECT g.unit, count(*) AS events FROM given g GROUP BY g.unit) AS w
              LEFT JOIN stored s USING (unit) LEFT JOIN moved m USING (unit) LEFT JOIN known k USING (unit)
        ), placed AS (
            SELECT g.*, v.status, s.current + row_number() OVER (PARTITION BY g.stream ORDER BY g.n) AS version,
                   v_first + sum(CASE WHEN v.status = 'appended' THEN 1 ELSE 0 END) OVER (ORDER BY g.n) - 1 AS position
              FROM given g JOIN verdicts v USING (unit) JOIN streams s USING (stream)
        ), appended AS (
            INSERT INTO events (global_position, stream_id, stream_version, event_id, type, data, metadata, recorded_at, transaction_id)
            SELECT p.position, p.stream, p.version, p.id, p.type, p.data, coalesce(p.metadata, '{}'::jsonb),
                   ledger_time(p_recorded_at), v_xid::text::xid8
              FROM placed p
             WHERE p.status = 'appended'
        ), order_rows AS (
            SELECT x.w, x.is_new, x.order_id, x.user_id, x.product_id, x.quantity, nullif(x.price, '')::numeric AS price,
                   nullif(x.currency, '') AS currency, x.app_account_token, x.state, x.version,
                   nullif(x.transaction_id, '') AS transaction_id, ledger_time(x.created_at) AS created_at,
                   ledger_time(x.updated_at) AS updated_at, ledger_time(nullif(x.queued_at, -9223372036854775808)) AS queued_at,
                   nullif(x.state_before_refund, '') AS state_before_refund, nullif(x.failure_reason, '') AS failure_reason,
                   coalesce(nullif(x.bundle_id, ''), (SELECT f.bundle_id FROM ledger_first_app f WHERE f.only_row)) AS bundle_id
              FROM unnest(p_order_writes, p_order_new, p_order_ids, p_order_users, p_order_products, p_order_quantities,
                          p_order_prices, p_order_currencies, p_order_tokens, p_order_states, p_order_versions,
                          p_order_transactions, p_order_created, p_order_updated, p_order_queued, p_order_before_refund,
                          p_order_failures, p_order_bundles)
                   AS x(w, is_new, order_id, user_id, product_id, quantity, price, currency, app_account_token, state, version,
                        transaction_id, created_at, updated_at, queued_at, state_before_refund, failure_reason, bundle_id)
              JOIN verdicts v ON v.unit = x.w AND v.status = 'appended'
        ), new_orders AS (
            INSERT INTO orders (order_id, user_id, product_id, quantity, price, currency, app_account_token, state, version,
                                transaction_id, created_at, updated_at, queued_at, state_before_refund, failure_reason, bundle_id)
            SELECT x.order_id, x.user_id, x.product_id, x.quantity, x.price, x.currency, x.app_account_token, x.state, x.version,
                   x.transaction_id, x.created_at, x.updated_at, x.queued_at, x.state_before_refund, x.failure_reason, x.bundle_id
              FROM order_rows x
             WHERE x.is_new
        ), changed_orders AS (
            UPDATE orders o
               SET user_id = x.user_id, product_id = x.product_id, quantity = x.quantity, price = x.price, currency = x.currency,
                   app_account_token = x.app_account_token, state = x.state, version = x.version, transaction_id = x.transaction_id,
                   created_at = x.created_at, updated_at = x.updated_at, queued_at = x.queued_at,
                   state_before_refund = x.state_before_refund, failure_reason = x.failure_reason
              FROM order_rows x
             WHERE o.order_id = x.order_id AND NOT x.is_new
        ), transaction_rows AS (
            SELECT x.w, x.is_new, x.transaction_id, nullif(x.order_id, '') AS order_id, nullif(x.user_id, '') AS user_id,
                   x.product_id, ledger_time(x.purchase_date) AS purchase_date, nullif(x.environment, '') AS environment, x.status,
                   ledger_time(x.received_at) AS received_at, ledger_time(x.updated_at) AS updated_at,
                   nullif(x.original_transaction_id, '') AS original_transaction_id,
                   nullif(x.app_transaction_id, '') AS app_transaction_id,
                   nullif(x.app_account_token, '00000000-0000-0000-0000-000000000000') AS app_account_token,
                   nullif(x.matched_by, '') AS matched_by, nullif(x.verification, '')::jsonb AS verification,
                   coalesce(nullif(x.bundle_id, ''), (SELECT f.bundle_id FROM ledger_first_app f WHERE f.only_row)) AS bundle_id,
                   nullif(x.storefront, '') AS storefront
              FROM unnest(p_transaction_writes, p_transaction_new, p_transaction_ids, p_transaction_orders, p_transaction_users,
                          p_transaction_products, p_transaction_purchased, p_transaction_environments, p_transaction_statuses,
                          p_transaction_received, p_transaction_updated, p_transaction_originals, p_transaction_apps,
                          p_transaction_tokens, p_transaction_matched_by, p_transaction_verifications, p_transaction_bundles,
                              p_transaction_storefronts)
                   AS x(w, is_new, transaction_id, order_id, user_id, product_id, purchase_date, environment, status, received_at,
                        updated_at, original_transaction_id, app_transaction_id, app_account_token, matched_by, verification,
                        bundle_id, storefront)
              JOIN verdicts v ON v.unit = x.w AND v.status = 'appended'
        ), new_transactions AS (
            INSERT INTO apple_transactions (transaction_id, order_id, user_id, product_id, purchase_date, environment, status,
                                            received_at, updated_at, original_transaction_id, app_transaction_id, app_account_token,
                                            matched_by, verification, bundle_id, storefront)
            SELECT x.transaction_id, x.order_id, x.user_id, x.product_id, x.purchase_date, x.environment, x.status, x.received_at,
                   x.updated_at, x.original_transaction_id, x.app_transaction_id, x.app_account_token, x.matched_by, x.verification,
                   x.bundle_id, x.storefront
              FROM transaction_rows x
             WHERE x.is_new
        ), changed_transactions AS (
            UPDATE apple_transactions t
               SET order_id = x.order_id, user_id = x.user_id, product_id = x.product_id, purchase_date = x.purchase_date,
                   environment = x.environment, status = x.status, received_at = x.received_at, updated_at = x.updated_at,
                   original_transaction_id = x.original_transaction_id, app_transaction_id = x.app_transaction_id,
                   app_account_token = x.app_account_token, matched_by = x.matched_by, verification = x.verification,
                   bundle_id = x.bundle_id, storefront = x.storefront
              FROM transaction_rows x
             WHERE t.transaction_id = x.transaction_id AND NOT x.is_new
        ), answered AS (
            SELECT p.n, CASE p.status WHEN 'appended' THEN p.version WHEN 'replayed' THEN e.stream_version ELSE -1 END AS version,
                   CASE p.status WHEN 'appended' THEN p.position WHEN 'replayed' THEN e.global_position ELSE -1 END AS position
              FROM placed p LEFT JOIN events e ON p.status = 'replayed' AND e.event_id = p.id
        )
        SELECT (SELECT array_agg(v.status ORDER BY v.unit) FROM verdicts v),
               (SELECT array_agg(v.detail ORDER BY v.unit) FROM verdicts v),
               (SELECT array_agg(a.version ORDER BY a.n) FROM answered a),
               (SELECT array_agg(a.position ORDER BY a.n) FROM answered a)
          INTO r_status, r_detail, r_versions, r_positions;
    END IF;

    -- The apps of what the call stored (issue 39), checked after the rows are written so one
    -- statement sees the orders and the transactions the call leaves; only calls that create orders or
    -- write transaction rows look. A refusal raises, undoing the call: the writer then writes each write
    -- alone and answers the refused one with the error (LedgerWriter.refusal). A new order names
    -- an app the ledger holds and has not retired, or names none while the ledger holds at most
    -- one (the first app's then, by the rule above); a transaction never belongs to an order of
    -- another app (app-mismatch). Each lookup here and of ledger_first_app above goes by a key:
    -- a plan that must scan a table costs, with seqscan off, enough to be JIT-compiled at every
    -- call, which takes seconds.
    IF true = ANY (p_order_new) THEN
        SELECT x.order_id, CASE WHEN x.bundle_id = '' THEN 'LE391'
                                WHEN a.bundle_id IS NULL THEN 'LE392'
                                ELSE 'LE393' END
          INTO v_refused, v_code
          FROM unnest(p_order_writes, p_order_new, p_order_ids, p_order_bundles) AS x(w, is_new, order_id, bundle_id)
          LEFT JOIN apps a ON a.bundle_id = x.bundle_id
         WHERE x.is_new AND r_status[x.w] = 'appended'
           AND CASE WHEN x.bundle_id = '' THEN (SELECT count(*) FROM (SELECT FROM apps a WHERE a.bundle_id > '' LIMIT 2) AS two) > 1 ELSE a.bundle_id IS NULL OR a.retired END
         LIMIT 1;
        IF v_refused IS NOT NULL THEN
            RAISE EXCEPTION 'order % cannot be created in this app', v_refused USING ERRCODE = v_code, DETAIL = v_refused;
        END IF;

        -- Each new order's appAccountToken (024_account_tokens.sql; per app since
        -- 030_tokens_per_app.sql): one that names its order (the default) is new to its app,
        -- else the table's key refuses it (as a unique violation); a user's token (its `created`
        -- event says `appAccountTokenScope: user`) is new, or its user's already, in that app. The key orders concurrent writers of one
        -- token. The orders of users' tokens are found in one pass over the events (a join of
        -- the events with the rows would compare every pair).
        SELECT coalesce(array_agg(substr(ev.stream, 7)), '{}') INTO v_user_token_orders
          FROM unnest(p_types, p_streams, p_data) AS ev(type, stream, data)
         WHERE ev.type = 'created' AND ev.data->>'appAccountTokenScope' = 'user';
        INSERT INTO app_account_tokens (app_account_token, user_id, bundle_id, order_id)
        SELECT x.token, o.user_id, o.bundle_id, x.order_id
          FROM unnest(p_order_writes, p_order_new, p_order_ids, p_order_tokens) AS x(w, is_new, order_id, token)
          JOIN orders o ON o.order_id = x.order_id
         WHERE x.is_new AND r_status[x.w] = 'appended' AND x.order_id <> ALL (v_user_token_orders);
        IF cardinality(v_user_token_orders) > 0 THEN
            INSERT INTO app_account_tokens (app_account_token, user_id, bundle_id, order_id)
            SELECT DISTINCT x.token, o.user_id, o.bundle_id, NULL::text
              FROM unnest(p_order_writes, p_order_new, p_order_ids, p_order_tokens) AS x(w, is_new, order_id, token)
              JOIN orders o ON o.order_id = x.order_id
             WHERE x.is_new AND r_status[x.w] = 'appended' AND x.order_id = ANY (v_user_token_orders)
                ON CONFLICT (app_account_token, (coalesce(bundle_id, ''))) DO NOTHING;
            SELECT x.token::text INTO v_refused
              FROM unnest(p_order_writes, p_order_new, p_order_ids, p_order_tokens) AS x(w, is_new, order_id, token)
              JOIN orders o ON o.order_id = x.order_id
              JOIN app_account_tokens k ON k.app_account_token = x.token AND coalesce(k.bundle_id, '') = coalesce(o.bundle_id, '')
             WHERE x.is_new AND r_status[x.w] = 'appended' AND x.order_id = ANY (v_user_token_orders)
               AND (k.order_id IS NOT NULL OR k.user_id <> o.user_id)
             LIMIT 1;
            IF v_refused IS NOT NULL THEN
                RAISE EXCEPTION 'appAccountToken % belongs to another user or order', v_refused USING ERRCODE = 'LE396', DETAIL = v_refused;
            END IF;
        END IF;
    END IF;
    IF cardinality(p_transaction_ids) > 0 THEN
        SELECT x.transaction_id INTO v_refused
          FROM unnest(p_transaction_writes, p_transaction_ids, p_transaction_orders, p_transaction_bundles)
               AS x(w, transaction_id, order_id, bundle_id)
          JOIN orders o ON o.order_id = x.order_id
         WHERE x.order_id <> '' AND x.bundle_id <> '' AND r_status[x.w] = 'appended' AND o.bundle_id <> x.bundle_id
         LIMIT 1;
        IF v_refused IS NOT NULL THEN
            RAISE EXCEPTION 'transaction % belongs to another app than its order', v_refused USING ERRCODE = 'LE394', DETAIL = v_refused;
        END IF;
        -- A transaction the ledger knows for another user (`ledger_known_user`: the order its
        -- appAccountToken names, else its Apple account's link, else an earlier transaction of
        -- that account tied to an order) never pays this user's order but by support's hand
        -- (issue 41, account-conflict): checked for the writes that tie a transaction to an order
        -- with `receipt-received`. The order its token names is its own user's, so the token
        -- decides. The intake then holds the transaction for support.
        SELECT x.transaction_id INTO v_refused
          FROM unnest(p_transaction_writes, p_transaction_ids, p_transaction_orders,
                      p_transaction_apps, p_transaction_tokens, p_transaction_matched_by, p_transaction_bundles)
               AS x(w, transaction_id, order_id, app_transaction_id, token, matched_by, bundle_id)
          JOIN orders o ON o.order_id = x.order_id
         WHERE x.order_id <> '' AND x.matched_by <> 'support' AND r_status[x.w] = 'appended'
           AND (x.app_transaction_id <> '' OR x.token <> '00000000-0000-0000-0000-000000000000')
           -- The order its own token names: its user is the one known, with no lookup.
           AND x.token <> o.app_account_token
           AND EXISTS (SELECT 1 FROM unnest(p_units, p_types, p_streams) AS ev(w, type, stream)
                        WHERE ev.w = x.w AND ev.type = 'receipt-received' AND ev.stream = 'order-' || x.order_id)
           AND ledger_known_user(nullif(x.token, '00000000-0000-0000-0000-000000000000'), nullif(x.app_transaction_id, ''),
                                 nullif(x.bundle_id, ''), x.transaction_id) <> o.user_id
         LIMIT 1;
        IF v_refused IS NOT NULL THEN
            RAISE EXCEPTION 'transaction % is of an Apple account the ledger knows for another user', v_refused
                USING ERRCODE = 'LE395', DETAIL = v_refused;
        END IF;
    END IF;

    IF p_commit THEN
        COMMIT;
    END IF;
END
$fn$;
