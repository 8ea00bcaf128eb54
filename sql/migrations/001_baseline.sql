-- Order Ledger's schema: the event log, the projections derived from it, API keys, the product
-- catalog, the views, and the roles. The routines, the one that appends to the log among them,
-- are definition files of their own in sql/routines. Later changes are new numbered files; this
-- one is never edited once applied (sql/README.md).

-------------------------------------------------------------------------------------------------
-- The event log
--
-- One append-only table for every stream. Positions come from the writing transaction's id:
-- global_position = xid * 4096 + n, where n counts the events that transaction appended (at most
-- 4096). Ordering by position is ordering by (transaction id, order of appending), and a reader
-- that returns only events of transactions older than its snapshot's xmin never passes a
-- position that a transaction still running holds: every such transaction has an xid >= xmin,
-- so all of its positions lie above everything the reader returned (promise 10). The append
-- routine places events by this rule, events_safe_position() is where readers stop
-- (sql/routines/append_events.sql).
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
