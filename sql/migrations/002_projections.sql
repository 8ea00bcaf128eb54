-- Projections: derived from the event log, written in the same transaction as the events they
-- come from, and rebuilt from the log by `ledger projections rebuild` (never edited by hand).

-- One row per order: the fields of the order as the API shows it.
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
);
CREATE UNIQUE INDEX orders_app_account_token_key ON orders (app_account_token);
CREATE INDEX orders_user_product ON orders (user_id, product_id, created_at);
CREATE INDEX orders_state ON orders (state, created_at);

-- One row per Apple transaction the ledger knows. The primary key is the money invariant: one
-- transaction id belongs to at most one order, whatever the concurrency (DESIGN.md promise 6).
CREATE TABLE apple_transactions (
    transaction_id text        PRIMARY KEY,
    order_id       text,
    user_id        text,
    product_id     text        NOT NULL,
    purchase_date  timestamptz NOT NULL,
    environment    text,
    status         text        NOT NULL,
    received_at    timestamptz NOT NULL,
    updated_at     timestamptz NOT NULL
);
-- An order holds at most one transaction.
CREATE UNIQUE INDEX apple_transactions_order_key ON apple_transactions (order_id) WHERE order_id IS NOT NULL;
CREATE INDEX apple_transactions_pool ON apple_transactions (user_id, product_id, purchase_date) WHERE order_id IS NULL;

-- The unmatched pool: verified transactions not tied to any order.
CREATE VIEW unmatched_transactions AS
    SELECT transaction_id, user_id, product_id, purchase_date, environment, received_at
      FROM apple_transactions
     WHERE order_id IS NULL;
