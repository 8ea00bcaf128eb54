-- A ledger's first app is recorded by a trigger on `apps` (013), which ran with the rights of
-- whoever added the app. The service's role of docs/operations.md ("Recommended roles") may add
-- apps (`POST /v1/apps`, the configured app at start) but may not write `ledger_first_app`: the
-- first app was refused (`permission denied for table ledger_first_app`), and a first start as
-- that role with LEDGER_APPLE_BUNDLE_ID set failed. The trigger now runs with its owner's rights.
ALTER FUNCTION apps_record_first_app() SECURITY DEFINER SET search_path = public, pg_temp;
