-- Receipts and the unmatched pool: what verification learnt of each Apple transaction, kept on
-- its projection row so the reconciler and support can search the pool.

ALTER TABLE apple_transactions
    ADD COLUMN original_transaction_id text,
    ADD COLUMN app_transaction_id      text,
    ADD COLUMN app_account_token       uuid,
    ADD COLUMN matched_by              text,
    -- For transactions that entered the pool: the verified transaction as `transaction-unmatched`
    -- recorded it (format, receipt SHA-256, bundle, price, why no order took it).
    ADD COLUMN verification            jsonb;

-- A later orphan of the same Apple account or subscription finds its user through these.
CREATE INDEX apple_transactions_app_transaction ON apple_transactions (app_transaction_id) WHERE app_transaction_id IS NOT NULL;
CREATE INDEX apple_transactions_original ON apple_transactions (original_transaction_id) WHERE original_transaction_id IS NOT NULL;

-- The pool holds verified transactions with no order that Apple has not refunded.
CREATE OR REPLACE VIEW unmatched_transactions AS
    SELECT transaction_id, user_id, product_id, purchase_date, environment, received_at,
           app_account_token, original_transaction_id, app_transaction_id, verification
      FROM apple_transactions
     WHERE order_id IS NULL AND status = 'unmatched';

CREATE OR REPLACE VIEW dashboards.unmatched_transactions AS
    SELECT transaction_id, user_id, product_id, purchase_date, environment, received_at,
           now() - received_at AS age
      FROM public.apple_transactions
     WHERE order_id IS NULL AND status = 'unmatched'
     ORDER BY received_at;

-- Proofs that failed verification (forged, wrong app, unauthenticated), for audit.
CREATE VIEW dashboards.rejected_proofs AS
    SELECT recorded_at, data->>'reason' AS reason, data->>'message' AS message,
           data->>'orderId' AS order_id, data->>'userId' AS user_id, data->>'transactionId' AS transaction_id,
           data->>'format' AS format, data->>'receiptSha256' AS receipt_sha256
      FROM public.events
     WHERE type = 'proof-rejected';

GRANT SELECT ON dashboards.rejected_proofs TO ledger_reader;
