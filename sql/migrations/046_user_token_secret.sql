-- The secret a user's first per-user appAccountToken is named with (OrderLedger.create): named by
-- the app and the user alone, anyone could compute another user's token, and an order created with
-- it (a backend passing on a client's token) locked that user out of token-less creates (409
-- app-account-token-taken). Named with this database's secret as well, it stays the same on every
-- server (two creating a user's first orders at once give both the same) and cannot be guessed.
-- Tokens already given stay as they are: a user's orders carry the one they carry.
CREATE TABLE ledger_secrets (
    name  text PRIMARY KEY,
    value uuid NOT NULL DEFAULT gen_random_uuid()
);
INSERT INTO ledger_secrets (name) VALUES ('user-token');
GRANT SELECT ON ledger_secrets TO ledger_writer;
