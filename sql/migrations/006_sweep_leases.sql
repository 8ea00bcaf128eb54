-- History sweeps claim an account for a while (a lease) instead of holding a database
-- transaction open while Apple answers: an open transaction held the gap-safe feed's safe
-- position back for the whole sweep, and made a second server wait on a new account's row.
-- And they keep the start date of an account's first request: Apple wants the same query with
-- every revision that follows.
ALTER TABLE apple_history_cursors
    ADD COLUMN claimed_until timestamptz,
    ADD COLUMN start_date    timestamptz;
