-- One lease table for every piece of background work (docs/architecture.md, "Leases"): the
-- history sweeps' accounts, the refund catch-up's accounts, the notification backfill, the calls
-- to Apple. Each job claimed, renewed and released a `claimed_until` of its own table in its own
-- way; now one type (`Leases`) does it, with a holder per claim, so a holder that lost its lease
-- cannot renew it. Times are the database's. Operational state: a rebuild keeps it, and losing it
-- costs a repeat of work that applies nothing twice.
CREATE TABLE leases (
    name       text        PRIMARY KEY CHECK (length(name) BETWEEN 1 AND 300),
    holder     uuid        NOT NULL,
    expires_at timestamptz NOT NULL
);
GRANT SELECT, INSERT, UPDATE, DELETE ON leases TO ledger_writer;

ALTER TABLE apple_history_cursors DROP COLUMN claimed_until;
ALTER TABLE apple_refund_cursors DROP COLUMN claimed_until;
ALTER TABLE apple_notification_backfill DROP COLUMN claimed_until;
ALTER TABLE apple_calls DROP COLUMN claimed_until;
