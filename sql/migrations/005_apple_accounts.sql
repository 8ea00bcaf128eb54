-- Apple accounts (docs/apple.md, "The Apple account link" and "History sweeps").
--
-- A link is the first event of the stream `apple-account-<appTransactionId>`: the events table's
-- one-event-per-version key lets one user own an account, and a later claim by another user is
-- an `account-link-conflict` event on the same stream. Links are read from the log itself, so
-- there is no projection of them to rebuild.

-- The accounts of a user, for the sweeps: only link events are in this index.
CREATE INDEX events_account_link_user ON events ((data->>'userId')) WHERE type = 'account-linked';

-- The reconciler's view of the pool: a transaction that came without a user takes the user of an
-- earlier transaction of the same Apple account or subscription, else the user who linked the
-- account.
CREATE OR REPLACE VIEW pool_with_users AS
    SELECT t.transaction_id, t.user_id, t.product_id, t.purchase_date,
           coalesce(t.user_id,
                    (SELECT k.user_id FROM apple_transactions k
                      WHERE k.app_transaction_id = t.app_transaction_id AND k.user_id IS NOT NULL
                      ORDER BY k.purchase_date LIMIT 1),
                    (SELECT k.user_id FROM apple_transactions k
                      WHERE k.original_transaction_id = t.original_transaction_id AND k.user_id IS NOT NULL
                      ORDER BY k.purchase_date LIMIT 1),
                    (SELECT e.data->>'userId' FROM events e
                      WHERE e.stream_id = 'apple-account-' || t.app_transaction_id AND e.stream_version = 0)) AS resolved_user_id,
           t.received_at, t.verification -> 'undoneOrderIds' AS undone_order_ids
      FROM apple_transactions t
     WHERE t.order_id IS NULL AND t.status = 'unmatched';

-- Where each account's history sweep stopped: Apple's `revision` for the next request. Keyed by
-- the id history is asked by (an appTransactionId, or a transaction id of an account whose
-- appTransactionId the ledger does not know). Operational state, not a projection: a rebuild
-- keeps it, and losing it costs one full sweep that ingests nothing twice.
CREATE TABLE apple_history_cursors (
    account_id text        PRIMARY KEY CHECK (length(account_id) BETWEEN 1 AND 128),
    user_id    text        NOT NULL,
    revision   text,
    swept_at   timestamptz,
    -- Transactions this account's sweeps found that the ledger did not know.
    found      bigint      NOT NULL DEFAULT 0
);

GRANT SELECT, INSERT, UPDATE ON apple_history_cursors TO ledger_writer;

-- For support: who owns each Apple account, the other users who claimed it, and its last sweep.
CREATE VIEW dashboards.apple_accounts AS
    SELECT substr(l.stream_id, length('apple-account-') + 1) AS app_transaction_id,
           l.data->>'userId' AS user_id, l.recorded_at AS linked_at,
           (SELECT count(*) FROM public.events c WHERE c.stream_id = l.stream_id AND c.stream_version > 0) AS conflicts,
           h.swept_at, h.found
      FROM public.events l
      LEFT JOIN public.apple_history_cursors h ON h.account_id = substr(l.stream_id, length('apple-account-') + 1)
     WHERE l.type = 'account-linked';

CREATE VIEW dashboards.apple_account_conflicts AS
    SELECT recorded_at, data->>'appTransactionId' AS app_transaction_id,
           data->>'userId' AS claimed_by, data->>'ownerUserId' AS owner_user_id
      FROM public.events
     WHERE type = 'account-link-conflict';

GRANT SELECT ON dashboards.apple_accounts, dashboards.apple_account_conflicts TO ledger_reader;
