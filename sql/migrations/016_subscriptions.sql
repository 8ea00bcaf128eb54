-- Subscriptions and family sharing (issue 40; docs/subscriptions.md). A transaction that never
-- pays an order has a status of its own in `apple_transactions`: `renewal` (a later period of an
-- auto-renewable subscription, recorded on its subscription or waiting for it) and `shared` (a
-- family member's access to another's purchase). The pool, the reconciler and every pairing
-- read `status = 'unmatched'` alone, so neither is ever paired.
ALTER TABLE apple_transactions DROP CONSTRAINT apple_transactions_status_check;
ALTER TABLE apple_transactions ADD CONSTRAINT apple_transactions_status_check
    CHECK (status IN ('unmatched', 'refunded', 'claimed', 'renewal', 'shared'));

-- The catalog's product types (LedgerCore ProductType); absent: the signed transaction's `type`
-- decides.
ALTER TABLE products
    ADD COLUMN type text CHECK (type IN ('consumable', 'non-consumable', 'auto-renewable', 'non-renewing')),
    ADD COLUMN subscription_group text;

-- The subscriptions projection: one row per `subscription-<originalTransactionId>` stream, as
-- LedgerCore's `Subscription.evolve` leaves it. The status is not stored: it is computed from
-- these facts and the time asked (`subscription_status` below, `Subscription.status(at:)`).
CREATE TABLE subscriptions (
    original_transaction_id text        PRIMARY KEY,
    bundle_id               text,
    environment             text        NOT NULL,
    user_id                 text,
    product_id              text        NOT NULL,
    subscription_group      text,
    family_shared           boolean     NOT NULL,
    started_at              timestamptz NOT NULL,
    expires_at              timestamptz,
    auto_renew              boolean,
    auto_renew_product_id   text,
    expiration_intent       integer,
    grace_period_expires_at timestamptz,
    in_billing_retry        boolean     NOT NULL,
    expired                 boolean     NOT NULL,
    revoked_at              timestamptz,
    version                 bigint      NOT NULL,
    updated_at              timestamptz NOT NULL
);
CREATE INDEX subscriptions_user ON subscriptions (user_id, bundle_id);

-- Its billed periods: one per `webOrderLineItemId` (else transaction id), however the period
-- reached the ledger.
CREATE TABLE subscription_periods (
    original_transaction_id text        NOT NULL REFERENCES subscriptions (original_transaction_id),
    period_key              text        NOT NULL,
    transaction_id          text        NOT NULL UNIQUE,
    kind                    text        NOT NULL CHECK (kind IN ('subscription-start', 'subscription-renewal')),
    product_id              text        NOT NULL,
    purchase_date           timestamptz NOT NULL,
    expires_at              timestamptz,
    price                   numeric,
    currency                text,
    refunded_at             timestamptz,
    refund_percentage       integer,
    PRIMARY KEY (original_transaction_id, period_key)
);

-- A subscription's status at `at` (LedgerCore `Subscription.status(at:)`, the same rule).
CREATE FUNCTION subscription_status(s subscriptions, at timestamptz) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $fn$
    SELECT CASE WHEN s.revoked_at IS NOT NULL THEN 'revoked'
                WHEN NOT s.expired AND s.expires_at IS NOT NULL AND at < s.expires_at THEN 'active'
                WHEN NOT s.expired AND s.grace_period_expires_at IS NOT NULL AND at < s.grace_period_expires_at THEN 'grace-period'
                WHEN NOT s.expired AND s.in_billing_retry THEN 'billing-retry'
                ELSE 'expired' END
$fn$;

-- Support's view: each subscription with its status now and the order that bought it.
CREATE VIEW dashboards.subscriptions AS
    SELECT s.original_transaction_id, s.bundle_id, s.environment, s.user_id, s.product_id, s.subscription_group,
           s.family_shared, subscription_status(s, now()) AS status, s.started_at, s.expires_at, s.auto_renew,
           s.auto_renew_product_id, s.grace_period_expires_at, s.in_billing_retry, s.revoked_at,
           t.order_id, (SELECT count(*) FROM subscription_periods p WHERE p.original_transaction_id = s.original_transaction_id) AS periods
      FROM public.subscriptions s
      LEFT JOIN public.apple_transactions t ON t.transaction_id = s.original_transaction_id;

GRANT SELECT, INSERT, UPDATE ON subscriptions, subscription_periods TO ledger_writer;
GRANT SELECT ON dashboards.subscriptions TO ledger_reader;
