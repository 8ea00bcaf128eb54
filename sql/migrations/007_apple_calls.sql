-- Calls to Apple that the log calls for (docs/apple.md, "Calls the ledger makes to Apple"):
-- answering a CONSUMPTION_REQUEST, finishing a delivered order's transaction, setting an order's
-- appAccountToken on a transaction the reconciler or support paired with it. A server with an
-- App Store Server API key reads the log past apple_call_feed's position (never past the
-- gap-safe position) and queues what the events read call for; nothing on the write path of an
-- order event queues anything. Servers then take due calls under a lease, call Apple, record the
-- outcome as an event, and delete the row.

CREATE TABLE apple_call_feed (
    only_row boolean PRIMARY KEY DEFAULT true CHECK (only_row),
    read_to  bigint  NOT NULL
);
-- Events from the migration on: an older request is past Apple's 12 hours anyway.
INSERT INTO apple_call_feed (read_to) SELECT coalesce(max(global_position), 0) FROM events;

CREATE TABLE apple_calls (
    call_id                 text        PRIMARY KEY,
    kind                    text        NOT NULL CHECK (kind IN ('consumption', 'finish', 'set-token')),
    transaction_id          text        NOT NULL,
    -- The stream of the event that called for it (a consumption answer is recorded there).
    stream_id               text        NOT NULL,
    order_id                text,
    notification_uuid       uuid,
    -- A consumption answer is of no use after it: Apple waits 12 hours.
    deadline                timestamptz,
    due_at                  timestamptz NOT NULL DEFAULT now(),
    attempts                integer     NOT NULL DEFAULT 0,
    last_error              text,
    claimed_until           timestamptz,
    created_at              timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX apple_calls_due ON apple_calls (due_at);

-- What a consumption answer says of a product beside the order's facts.
ALTER TABLE products
    ADD COLUMN sample_content_provided boolean,
    ADD COLUMN refund_preference       text CHECK (refund_preference IN ('DECLINE', 'GRANT_FULL', 'GRANT_PRORATED'));

-- The notification backfill's request and where its pages stopped, so a stopped one resumes
-- (Apple's pagination token is only good with the same dates).
CREATE TABLE apple_notification_backfill (
    only_row         boolean     PRIMARY KEY DEFAULT true CHECK (only_row),
    start_date       timestamptz,
    end_date         timestamptz,
    pagination_token text,
    finished_at      timestamptz,
    claimed_until    timestamptz
);
INSERT INTO apple_notification_backfill DEFAULT VALUES;
-- The last notification recorded: where the next backfill starts.
CREATE INDEX events_notifications ON events (global_position) WHERE type = 'notification-received';

-- Refund catch-up: Apple's refund-history revision per account, and when it was last read.
CREATE TABLE apple_refund_cursors (
    account_id    text        PRIMARY KEY,
    revision      text,
    checked_at    timestamptz,
    claimed_until timestamptz
);

-- For support and alerts: the calls still to make, and how they have gone so far.
CREATE VIEW dashboards.apple_calls AS
    SELECT kind, transaction_id, order_id, attempts, last_error, due_at, deadline,
           now() - created_at AS age, deadline - now() AS time_left
      FROM public.apple_calls;
GRANT SELECT ON dashboards.apple_calls TO ledger_reader;

GRANT SELECT, UPDATE ON apple_call_feed TO ledger_writer;
GRANT SELECT, INSERT, UPDATE, DELETE ON apple_calls, apple_notification_backfill, apple_refund_cursors TO ledger_writer;
