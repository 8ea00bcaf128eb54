-- Order Ledger's schema: the event log, the one routine that appends to it, the projections
-- derived from it, API keys, the product catalog, the views, and the roles. Later changes are
-- new numbered files; this one is never edited once applied (docs/architecture.md, "Migrations").

-------------------------------------------------------------------------------------------------
-- The event log
--
-- One append-only table for every stream. Positions come from the writing transaction's id:
-- global_position = xid * 4096 + n, where n counts the events that transaction appended (at most
-- 4096). Ordering by position is ordering by (transaction id, order of appending), and a reader
-- that returns only events of transactions older than its snapshot's xmin never passes a
-- position that a transaction still running holds: every such transaction has an xid >= xmin,
-- so all of its positions lie above everything the reader returned (promise 10).
-------------------------------------------------------------------------------------------------

CREATE TABLE events (
    global_position bigint      NOT NULL,
    stream_id       text        NOT NULL,
    stream_version  bigint      NOT NULL,
    event_id        uuid        NOT NULL,
    type            text        NOT NULL,
    data            jsonb       NOT NULL,
    metadata        jsonb       NOT NULL DEFAULT '{}'::jsonb,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    transaction_id  xid8        NOT NULL DEFAULT pg_current_xact_id(),
    CONSTRAINT events_pkey PRIMARY KEY (global_position),
    -- The idempotency key: an event id is stored once (promise 3).
    CONSTRAINT events_event_id_key UNIQUE (event_id),
    -- One event per version of a stream: two racing appends cannot both take a version (promise 4).
    CONSTRAINT events_stream_version_key UNIQUE (stream_id, stream_version),
    CONSTRAINT events_stream_id_length CHECK (length(stream_id) BETWEEN 1 AND 256),
    CONSTRAINT events_type_length CHECK (length(type) BETWEEN 1 AND 128),
    CONSTRAINT events_stream_version_non_negative CHECK (stream_version >= 0),
    CONSTRAINT events_position_of_transaction CHECK ((global_position >> 12) = transaction_id::text::bigint)
);

COMMENT ON TABLE events IS 'Append-only event log of Order Ledger; never updated or deleted.';
COMMENT ON COLUMN events.global_position IS 'transaction id * 4096 + ordinal: increasing in commit-visible order for gap-safe readers';
COMMENT ON COLUMN events.transaction_id IS 'xid8 of the writing transaction, compared with pg_snapshot_xmin by readers';

-- Append-only for every role, the owner included (promise 1).
CREATE FUNCTION events_append_only() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION 'the event log is append-only: % on % is not allowed', TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'LE010', HINT = 'append a new event instead';
END
$fn$;

CREATE TRIGGER events_no_update_or_delete
    BEFORE UPDATE OR DELETE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_append_only();

CREATE TRIGGER events_no_truncate
    BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_append_only();

-- The highest position a gap-safe reader may return now: every event at or below it is final.
CREATE FUNCTION events_safe_position() RETURNS bigint
LANGUAGE sql STABLE AS $fn$
    SELECT (pg_snapshot_xmin(pg_current_snapshot())::text::bigint << 12) - 1
$fn$;

-------------------------------------------------------------------------------------------------
-- Projections
--
-- Derived from the log, written by the append routine in the same transaction as the events they
-- come from, and rebuilt from the log by `ledger projections rebuild` (promise 9). The rows are
-- computed in Swift by one set of rules (LedgerCore's `Projection`), which the rebuild uses too.
-------------------------------------------------------------------------------------------------

-- One row per order: the order as the API shows it. Every order event updates its row, so no
-- index reads a column an event changes (state, version, transaction, times, reasons): the update
-- then stays on its page without new index entries (a HOT update), and each page keeps room for
-- the next versions of its rows.
CREATE TABLE orders (
    order_id            text        PRIMARY KEY,
    user_id             text        NOT NULL,
    product_id          text        NOT NULL,
    quantity            integer     NOT NULL,
    price               numeric,
    currency            text,
    app_account_token   uuid        NOT NULL,
    state               text        NOT NULL,
    version             bigint      NOT NULL,
    transaction_id      text,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    queued_at           timestamptz,
    state_before_refund text,
    failure_reason      text
) WITH (fillfactor = 60);
CREATE UNIQUE INDEX orders_app_account_token_key ON orders (app_account_token);
-- A user's orders of one product: the search route, the reconciler's candidates.
CREATE INDEX orders_user_product ON orders (user_id, product_id, created_at);

-- One row per Apple transaction the ledger knows: waiting in the pool (no order; status
-- `unmatched`, or `refunded` when Apple refunded it first), or `claimed` by its order.
CREATE TABLE apple_transactions (
    transaction_id          text        PRIMARY KEY,
    order_id                text,
    user_id                 text,
    product_id              text        NOT NULL,
    purchase_date           timestamptz NOT NULL,
    environment             text,
    status                  text        NOT NULL CHECK (status IN ('unmatched', 'refunded', 'claimed')),
    received_at             timestamptz NOT NULL,
    updated_at              timestamptz NOT NULL,
    original_transaction_id text,
    app_transaction_id      text,
    app_account_token       uuid,
    matched_by              text,
    -- For a transaction that went through the pool: its `transaction-unmatched` body (the
    -- verified transaction and why no order took it).
    verification            jsonb
) WITH (fillfactor = 80);
-- The money invariant (promise 6): the primary key grants a transaction id once across all users,
-- and an order holds at most one transaction.
CREATE UNIQUE INDEX apple_transactions_order_key ON apple_transactions (order_id) WHERE order_id IS NOT NULL;
CREATE INDEX apple_transactions_pool ON apple_transactions (user_id, product_id, purchase_date) WHERE order_id IS NULL;
-- A later orphan of the same Apple account or subscription finds its user through these.
CREATE INDEX apple_transactions_app_transaction ON apple_transactions (app_transaction_id) WHERE app_transaction_id IS NOT NULL;
CREATE INDEX apple_transactions_original ON apple_transactions (original_transaction_id) WHERE original_transaction_id IS NOT NULL;

-------------------------------------------------------------------------------------------------
-- The append routine: every event the ledger stores goes through it (docs/architecture.md,
-- "The append transaction").
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
-- (the time the rows were computed at, so a replay of the log computes the same rows). p_commit: COMMIT before answering (called outside a
-- transaction block, so an acknowledged write is durable, promise 2), or leave the caller's
-- transaction open. Answers: r_status and r_detail per write (r_detail of wrong-expected-version:
-- '<current version> <stream>', -1 when the stream does not exist), r_versions and r_positions
-- per event (-1 where nothing is stored).
-------------------------------------------------------------------------------------------------

-- A time the writer sends as microseconds since 2000-01-01 UTC. STABLE, as timestamptz + interval
-- is: so the planner inlines it where it is used.
CREATE FUNCTION ledger_time(microseconds bigint) RETURNS timestamptz
LANGUAGE sql STABLE PARALLEL SAFE AS $fn$
    SELECT timestamptz '2000-01-01 00:00:00+00' + microseconds * interval '1 microsecond'
$fn$;

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
BEGIN
    -- A procedure that may COMMIT cannot carry SET clauses. Every statement here is an index
    -- lookup: a plan cached while the log was small must not scan it whole once it is large. And
    -- generic plans, kept for the session, rather than a custom plan for every call's arrays.
    PERFORM set_config('enable_seqscan', 'off', true);
    PERFORM set_config('plan_cache_mode', 'force_generic_plan', true);

    -- One writer per stream at a time, writers of other streams never wait; a claimed transaction
    -- is locked as its stream is. Taken in one order, so that two calls never deadlock, and
    -- before the statement below, which then reads what committed before it got them.
    PERFORM pg_advisory_xact_lock(l.h)
       FROM (SELECT DISTINCT hashtextextended(s, 0) AS h
               FROM unnest(p_streams || ARRAY(SELECT 'transaction-' || c FROM unnest(p_claims) AS c WHERE c <> '')) AS s
              ORDER BY 1 OFFSET 0) AS l;

    -- The verdict on each write, the events and rows of those taken, and the answer, in one
    -- statement: its parts all read the log as it was before it. Every lookup is by a key of a
    -- row the call names, so the cost does not grow with the log.
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
        -- The position rule, the only place that writes it: this transaction's id * 4096, then on
        -- (4096 events a transaction at most: the table's check refuses more).
        SELECT g.*, v.status, s.current + row_number() OVER (PARTITION BY g.stream ORDER BY g.n) AS version,
               coalesce((SELECT max(e.global_position) + 1 FROM events e
                          WHERE e.global_position >= (v_xid << 12) AND e.global_position < ((v_xid + 1) << 12)), v_xid << 12)
               + sum(CASE WHEN v.status = 'appended' THEN 1 ELSE 0 END) OVER (ORDER BY g.n) - 1 AS position
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
               nullif(x.state_before_refund, '') AS state_before_refund, nullif(x.failure_reason, '') AS failure_reason
          FROM unnest(p_order_writes, p_order_new, p_order_ids, p_order_users, p_order_products, p_order_quantities,
                      p_order_prices, p_order_currencies, p_order_tokens, p_order_states, p_order_versions,
                      p_order_transactions, p_order_created, p_order_updated, p_order_queued, p_order_before_refund,
                      p_order_failures)
               AS x(w, is_new, order_id, user_id, product_id, quantity, price, currency, app_account_token, state, version,
                    transaction_id, created_at, updated_at, queued_at, state_before_refund, failure_reason)
          JOIN verdicts v ON v.unit = x.w AND v.status = 'appended'
    ), new_orders AS (
        INSERT INTO orders (order_id, user_id, product_id, quantity, price, currency, app_account_token, state, version,
                            transaction_id, created_at, updated_at, queued_at, state_before_refund, failure_reason)
        SELECT x.order_id, x.user_id, x.product_id, x.quantity, x.price, x.currency, x.app_account_token, x.state, x.version,
               x.transaction_id, x.created_at, x.updated_at, x.queued_at, x.state_before_refund, x.failure_reason
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
               nullif(x.matched_by, '') AS matched_by, nullif(x.verification, '')::jsonb AS verification
          FROM unnest(p_transaction_writes, p_transaction_new, p_transaction_ids, p_transaction_orders, p_transaction_users,
                      p_transaction_products, p_transaction_purchased, p_transaction_environments, p_transaction_statuses,
                      p_transaction_received, p_transaction_updated, p_transaction_originals, p_transaction_apps,
                      p_transaction_tokens, p_transaction_matched_by, p_transaction_verifications)
               AS x(w, is_new, transaction_id, order_id, user_id, product_id, purchase_date, environment, status, received_at,
                    updated_at, original_transaction_id, app_transaction_id, app_account_token, matched_by, verification)
          JOIN verdicts v ON v.unit = x.w AND v.status = 'appended'
    ), new_transactions AS (
        INSERT INTO apple_transactions (transaction_id, order_id, user_id, product_id, purchase_date, environment, status,
                                        received_at, updated_at, original_transaction_id, app_transaction_id, app_account_token,
                                        matched_by, verification)
        SELECT x.transaction_id, x.order_id, x.user_id, x.product_id, x.purchase_date, x.environment, x.status, x.received_at,
               x.updated_at, x.original_transaction_id, x.app_transaction_id, x.app_account_token, x.matched_by, x.verification
          FROM transaction_rows x
         WHERE x.is_new
    ), changed_transactions AS (
        UPDATE apple_transactions t
           SET order_id = x.order_id, user_id = x.user_id, product_id = x.product_id, purchase_date = x.purchase_date,
               environment = x.environment, status = x.status, received_at = x.received_at, updated_at = x.updated_at,
               original_transaction_id = x.original_transaction_id, app_transaction_id = x.app_transaction_id,
               app_account_token = x.app_account_token, matched_by = x.matched_by, verification = x.verification
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

    IF p_commit THEN
        COMMIT;
    END IF;
END
$fn$;

-------------------------------------------------------------------------------------------------
-- Reading the pool
-------------------------------------------------------------------------------------------------

-- The unmatched pool: verified transactions tied to no order that Apple has not refunded.
CREATE VIEW unmatched_transactions AS
    SELECT transaction_id, user_id, product_id, purchase_date, environment, received_at,
           app_account_token, original_transaction_id, app_transaction_id, verification
      FROM apple_transactions
     WHERE order_id IS NULL AND status = 'unmatched';

-- The reconciler's view of the pool: each unmatched transaction with the user it belongs to, its
-- own or, when it came without one, the user of an earlier transaction of the same Apple account
-- (appTransactionId) or subscription (originalTransactionId) that the ledger has tied to a user.
CREATE VIEW pool_with_users AS
    SELECT t.transaction_id, t.user_id, t.product_id, t.purchase_date,
           coalesce(t.user_id,
                    (SELECT k.user_id FROM apple_transactions k
                      WHERE k.app_transaction_id = t.app_transaction_id AND k.user_id IS NOT NULL
                      ORDER BY k.purchase_date LIMIT 1),
                    (SELECT k.user_id FROM apple_transactions k
                      WHERE k.original_transaction_id = t.original_transaction_id AND k.user_id IS NOT NULL
                      ORDER BY k.purchase_date LIMIT 1)) AS resolved_user_id
      FROM apple_transactions t
     WHERE t.order_id IS NULL AND t.status = 'unmatched';

-------------------------------------------------------------------------------------------------
-- API keys and the product catalog: configuration, not projections (a rebuild keeps them)
-------------------------------------------------------------------------------------------------

-- Only a SHA-256 of each key is stored; the key itself is shown once, at creation.
CREATE TABLE api_keys (
    name       text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 128),
    key_hash   text        NOT NULL UNIQUE,
    scopes     text[]      NOT NULL CHECK (scopes <@ ARRAY['append', 'read', 'admin'] AND cardinality(scopes) > 0),
    created_at timestamptz NOT NULL DEFAULT now(),
    revoked_at timestamptz
);

-- The product ids the app sells or sold, managed by API, CLI or SQL. A retired product's orphans
-- never get a recovery order: a later app version may have removed what they bought.
CREATE TABLE products (
    product_id text        PRIMARY KEY CHECK (length(product_id) BETWEEN 1 AND 128),
    status     text        NOT NULL DEFAULT 'active' CHECK (status IN ('active', 'retired')),
    price      numeric     CHECK (price >= 0),
    currency   text        CHECK (currency ~ '^[A-Z]{3}$'),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-------------------------------------------------------------------------------------------------
-- Dashboards: read-only views for support and finance in a schema of their own
-- (docs/dashboards.md). They read the tables with their owner's rights.
-------------------------------------------------------------------------------------------------

CREATE SCHEMA dashboards;

CREATE VIEW dashboards.orders AS
    SELECT order_id, user_id, product_id, quantity, price, currency, state, transaction_id,
           created_at, updated_at, now() - created_at AS age, now() - updated_at AS time_in_state
      FROM public.orders;

CREATE VIEW dashboards.unmatched_transactions AS
    SELECT transaction_id, user_id, product_id, purchase_date, environment, received_at,
           now() - received_at AS age
      FROM public.apple_transactions
     WHERE order_id IS NULL AND status = 'unmatched'
     ORDER BY received_at;

-- Orders created per day (UTC), product and current state.
CREATE VIEW dashboards.daily_orders AS
    SELECT (created_at AT TIME ZONE 'UTC')::date AS day, product_id, state, count(*) AS orders,
           sum(price * quantity) AS amount, currency
      FROM public.orders
     GROUP BY 1, 2, 3, currency;

-- Proofs that failed verification (forged, wrong app, unauthenticated), for audit.
CREATE VIEW dashboards.rejected_proofs AS
    SELECT recorded_at, data->>'reason' AS reason, data->>'message' AS message,
           data->>'orderId' AS order_id, data->>'userId' AS user_id, data->>'transactionId' AS transaction_id,
           data->>'format' AS format, data->>'receiptSha256' AS receipt_sha256
      FROM public.events
     WHERE type = 'proof-rejected';

CREATE VIEW dashboards.products AS
    SELECT product_id, status, price, currency, updated_at FROM public.products;

-------------------------------------------------------------------------------------------------
-- Roles (docs/operations.md, "Database roles and least privilege"). CREATE ROLE is cluster-wide,
-- so another database's migration may have made them.
-------------------------------------------------------------------------------------------------

DO $roles$
BEGIN
    CREATE ROLE ledger_writer NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END
$roles$;

DO $roles$
BEGIN
    CREATE ROLE ledger_reader NOLOGIN;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END
$roles$;

-- ledger_writer appends through append_events: the log (never changed: no UPDATE, DELETE or
-- TRUNCATE, promise 1) and the projection rows it writes beside each event.
REVOKE ALL ON events FROM PUBLIC;
GRANT INSERT, SELECT ON events TO ledger_writer;
GRANT SELECT, INSERT, UPDATE ON orders, apple_transactions TO ledger_writer;

REVOKE ALL ON SCHEMA dashboards FROM PUBLIC;
GRANT USAGE ON SCHEMA dashboards TO ledger_reader;
GRANT SELECT ON ALL TABLES IN SCHEMA dashboards TO ledger_reader;
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM ledger_reader;
